//! The native `lemon` engine on the real binary against the shared fake LLM
//! provider: the default engine with and without a key, streamed deltas, tool
//! round trips (`bash`, `edit`), steering mid-run, compaction, a budget, cancel
//! of a running command, refused paths and a session resumed after a restart.
//!
//! Images sent with a message are checked through `lemon_engines`' public API
//! (the engine the gateway builds from its config section), over real HTTP
//! to the fake in each of the three wire protocols, and end to end: an image
//! attached to `POST /v1/runs` reaches the model with its bytes.

use futures::StreamExt;
use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::support::{command, home_with, Gateway, PATIENCE};

const KEY: &str = "sk-test-native-key";

/// A fake that requires the key the gateway is given.
async fn fake_llm() -> FakeLlm {
    FakeLlm::builder().api_key(KEY).start().await
}

fn call(id: &str, name: &str, arguments: &Value) -> FakeToolCall {
    FakeToolCall::new(id, name, &[&arguments.to_string()])
}

/// A run's events over SSE, read as they come.
struct Live {
    rx: mpsc::UnboundedReceiver<(String, Value)>,
    seen: Vec<(String, Value)>,
}

impl Live {
    async fn open(gateway: &Gateway, run_id: &str) -> Live {
        let response = gateway.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut parser = lemon_tests::event_stream::EventStream::default();
            let mut stream = response.bytes_stream();
            while let Some(Ok(chunk)) = stream.next().await {
                for event in parser.push(&chunk) {
                    let data: Value = serde_json::from_str(&event.data).unwrap();
                    if tx.send((event.event, data)).is_err() {
                        return;
                    }
                }
            }
        });
        Live { rx, seen: Vec::new() }
    }

    /// Reads until an event matches; that event.
    async fn until(&mut self, what: &str, pred: impl Fn(&str, &Value) -> bool) -> Value {
        let found = tokio::time::timeout(PATIENCE, async {
            loop {
                let (kind, data) = self.rx.recv().await?;
                self.seen.push((kind.clone(), data.clone()));
                if pred(&kind, &data) {
                    return Some(data);
                }
            }
        })
        .await;
        match found {
            Ok(Some(data)) => data,
            Ok(None) => panic!("the stream ended before {what}: {:?}", self.seen),
            Err(_) => panic!("no {what} in time: {:?}", self.seen),
        }
    }

    async fn completed(&mut self) -> Value {
        self.until("run_completed", |kind, _| kind == "run_completed").await
    }
}

/// A started action of the named tool.
fn tool_started(name: &'static str) -> impl Fn(&str, &Value) -> bool {
    move |kind, data| {
        kind == "engine_action"
            && data.to_string().contains("\"started\"")
            && data.to_string().contains(&format!("\"name\":\"{name}\""))
    }
}

/// Polls `check` until it holds, bounded by the tests' patience.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    tokio::time::timeout(PATIENCE, async {
        while !check() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} in time"));
}

fn lemon_config(base_url: &str) -> String {
    format!(
        "{}\n[gateway.engines.lemon]\nbase_url = \"{base_url}\"\nmodel = \"test-model\"\n",
        crate::support::ALLOW_EVERY_CALL
    )
}

fn write_key(home: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    std::fs::write(&path, format!("openai_api_key = \"{KEY}\"\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn engine_status(status: &Value, id: &str) -> Value {
    status["engines"].as_array().unwrap().iter().find(|e| e["id"] == id).unwrap().clone()
}

#[tokio::test]
async fn without_a_key_the_default_engine_is_echo_and_the_status_says_why() {
    let gateway = Gateway::start("").await;
    let status = gateway.status().await;
    assert_eq!(status["default_engine"], "echo", "{status}");
    assert_eq!(status["default_engine_reason"], "no openai_api_key set", "{status}");
    let lemon = engine_status(&status, "lemon");
    assert_eq!(lemon["available"], false, "{lemon}");
    let reason = lemon["reason"].as_str().unwrap();
    assert!(reason.contains("openai_api_key") && reason.contains("OPENAI_API_KEY"), "{reason}");
    // The first message of a newcomer still answers.
    let run_id = gateway.submit(json!({ "prompt": "hello there" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["resume"]["engine"], "echo", "{run}");
    assert_eq!(run["answer"], "hello there", "{run}");
    gateway.terminate().await;
}

/// A server on this machine that takes no key (Ollama, llama.cpp): with only
/// its `base_url` set, `lemon` is the default engine and answers, and no key
/// header is sent; `api_key_secret = ""` does the same for any server.
#[tokio::test]
async fn a_server_that_takes_no_key_needs_none() {
    let llm = FakeLlm::builder().start().await;
    llm.push(Turn::text(&["Hi ", "from a local model."]));
    let gateway = Gateway::start(&lemon_config(&llm.base_url())).await;
    let status = gateway.status().await;
    assert_eq!(status["default_engine"], "lemon", "{status}");
    let reason = status["default_engine_reason"].as_str().unwrap();
    assert!(reason.ends_with("is on this machine and needs no key"), "{reason}");
    let run_id = gateway.submit(json!({ "prompt": "hello" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "Hi from a local model.", "{run}");
    assert_eq!(llm.requests()[0].header("authorization"), None);
    gateway.terminate().await;

    let config = format!("{}api_key_secret = \"\"\n", lemon_config(&llm.base_url()));
    let gateway = Gateway::start(&config).await;
    let status = gateway.status().await;
    assert_eq!(status["default_engine"], "lemon", "{status}");
    assert_eq!(status["default_engine_reason"], "api_key_secret = \"\": its server needs no key");
    gateway.terminate().await;
}

/// A key set while the gateway runs (`secrets set`) makes `lemon` the default
/// engine at once: `/v1/status` says why and the next run answers on it.
#[tokio::test]
async fn a_key_set_while_running_makes_lemon_the_default_at_once() {
    let llm = fake_llm().await;
    llm.push(Turn::text(&["Answered by ", "lemon."]));
    // `0.0.0.0` reaches the fake on this machine without naming a local server
    // (which would need no key and make `lemon` the default from the start).
    let url = llm.base_url().replace("127.0.0.1", "0.0.0.0");
    let gateway = Gateway::start(&lemon_config(&url)).await;
    assert_eq!(gateway.status().await["default_engine"], "echo");

    let mut set = command(&gateway.home);
    set.args(["secrets", "set", "openai_api_key"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = set.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, format!("{KEY}\n").as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(PATIENCE, child.wait_with_output()).await.unwrap().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let status = tokio::time::timeout(PATIENCE, async {
        loop {
            let status = gateway.status().await;
            if status["default_engine"] == "lemon" {
                return status;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("lemon became the default engine in time");
    assert_eq!(status["default_engine_reason"], "openai_api_key is set", "{status}");
    let run_id = gateway.submit(json!({ "prompt": "who answers?" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["resume"]["engine"], "lemon", "{run}");
    assert_eq!(run["answer"], "Answered by lemon.", "{run}");
    gateway.terminate().await;
}

#[tokio::test]
async fn with_a_key_lemon_is_the_default_and_streams_a_bash_round_trip() {
    let workdir = tempfile::tempdir().unwrap();
    let llm = fake_llm().await;
    let command = json!({ "command": "echo changed > note.txt && cat note.txt" });
    llm.push(Turn::tool_calls(vec![call("call_1", "bash", &command)]));
    llm.push(Turn::text(&["The file ", "now says ", "changed."]));
    let dir = home_with(&lemon_config(&llm.base_url()));
    write_key(dir.path());
    let gateway = Gateway::start_in(dir.path()).await;
    let status = gateway.status().await;
    assert_eq!(status["default_engine"], "lemon", "{status}");
    assert_eq!(status["default_engine_reason"], "openai_api_key is set", "{status}");
    assert_eq!(engine_status(&status, "lemon")["available"], true);

    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "change the note", "cwd": cwd })).await;
    let events = gateway.events(&run_id).await;
    let deltas: String = events
        .iter()
        .filter(|(kind, _)| kind == "delta")
        .filter_map(|(_, data)| data["text"].as_str())
        .collect();
    assert_eq!(deltas, "The file now says changed.", "{events:?}");
    let actions: Vec<&Value> =
        events.iter().filter(|(k, _)| k == "engine_action").map(|(_, d)| d).collect();
    assert!(
        actions
            .iter()
            .any(|a| a.to_string().contains("completed") && a.to_string().contains("bash")),
        "{actions:?}"
    );
    assert_eq!(std::fs::read_to_string(workdir.path().join("note.txt")).unwrap(), "changed\n");
    let run = gateway.run(&run_id).await;
    assert_eq!(run["resume"]["engine"], "lemon", "{run}");
    assert_eq!(run["answer"], "The file now says changed.", "{run}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body["model"], "test-model");
    assert_eq!(requests[0].body["stream"], true);
    let second = requests[1].body["messages"].to_string();
    assert!(second.contains("changed"), "the tool's output went back: {second}");
    assert!(!format!("{events:?}{run}").contains(KEY));
    gateway.terminate().await;
}

/// A tool call shows its command, not the tool's name, in a Telegram chat's
/// progress message while it runs, and in `logs`.
#[tokio::test]
async fn a_bash_call_shows_its_command_in_logs_and_telegrams_progress() {
    use crate::telegram_e2e::{fake_telegram, wait_for_reply, USER};
    let workdir = tempfile::tempdir().unwrap();
    let llm = FakeLlm::builder().start().await;
    let command_line = "while [ ! -e go ]; do sleep 0.02; done; echo hello from telegram";
    llm.push(Turn::tool_calls(vec![call("call_1", "bash", &json!({ "command": command_line }))]));
    llm.push(Turn::text(&["It said hello."]));
    let fake = fake_telegram().await;
    let extra = format!(
        "default_cwd = \"{}\"\n{}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
        workdir.path().display(),
        crate::support::TRUST_EVERY_CALL,
        llm.base_url()
    );
    let telegram = "engine = \"lemon\"\nprogress_delay_ms = 0";
    let config = crate::telegram_e2e::config(&fake, telegram, &extra);
    let gateway = crate::telegram_e2e::start(&fake, &config).await;
    let chat = lemon_tests::fake_telegram::ChatSpec::private(USER);
    let asked = fake.inject_text(&chat, USER, "say hello");
    let shown = format!("- {command_line}: running");
    fake.wait_until("the progress message names the command", PATIENCE, |s| {
        s.messages(USER)
            .iter()
            .any(|m| m.reply_to == Some(asked.message_id) && m.text.contains(&shown))
    })
    .await;
    std::fs::write(workdir.path().join("go"), "").unwrap();
    wait_for_reply(&fake, USER, asked.message_id, "It said hello.").await;

    let runs = gateway.get("/v1/runs").send().await.unwrap().json::<Value>().await.unwrap();
    let run_id = runs["runs"][0]["run_id"].as_str().unwrap().to_owned();
    let mut logs = command(&gateway.home);
    logs.args(["logs", &run_id]).env("LEMON_URL", &gateway.api);
    let out = tokio::time::timeout(PATIENCE, logs.output()).await.unwrap().unwrap();
    let logs = String::from_utf8_lossy(&out.stdout);
    assert!(logs.contains(&format!("started command: {command_line}")), "{logs}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_lemon_session_resumes_after_a_restart() {
    let llm = fake_llm().await;
    llm.push(Turn::text(&["first ", "answer"]));
    llm.push(Turn::text(&["second ", "answer"]));
    let dir = home_with(&lemon_config(&llm.base_url()));
    write_key(dir.path());
    let gateway = Gateway::start_in(dir.path()).await;
    let run_id = gateway.submit(json!({ "prompt": "remember lemons", "engine": "lemon" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "first answer", "{run}");
    let token = run["resume"]["value"]
        .as_str()
        .unwrap_or_else(|| panic!("a resume token: {run}"))
        .to_owned();
    gateway.terminate().await;

    let gateway = Gateway::start_in(dir.path()).await;
    let prompt = format!("lemon resume {token}\nwhat did I say?");
    let run_id = gateway.submit(json!({ "prompt": prompt, "session_key": "another" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "second answer", "{run}");
    let second = llm.requests()[1].body["messages"].to_string();
    assert!(second.contains("remember lemons") && second.contains("first answer"), "{second}");
    gateway.terminate().await;
}

/// A home whose config has the `lemon` section pointing at `llm`, `extra` lines
/// after it, and the key in the secrets file.
fn home_for(llm: &FakeLlm, extra: &str) -> tempfile::TempDir {
    let dir = home_with(&format!("{}{extra}", lemon_config(&llm.base_url())));
    write_key(dir.path());
    dir
}

#[tokio::test]
async fn the_key_from_the_environment_streams_deltas_and_an_edit_changes_the_file() {
    let workdir = tempfile::tempdir().unwrap();
    std::fs::write(workdir.path().join("greeting.txt"), "hello world\n").unwrap();
    let llm = fake_llm().await;
    let edit = json!({ "path": "greeting.txt", "old_string": "world", "new_string": "lemons" });
    llm.push(Turn::tool_calls(vec![call("call_edit", "edit", &edit)]));
    llm.push(Turn::text(&["Edited: ", "it greets ", "lemons now."]));
    let dir = home_with(&lemon_config(&llm.base_url()));
    let mut cmd = command(dir.path());
    cmd.env("OPENAI_API_KEY", KEY);
    let gateway = Gateway::spawn(cmd, dir.path()).await;
    assert_eq!(gateway.status().await["default_engine"], "lemon");

    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "greet lemons", "cwd": cwd })).await;
    let events = gateway.events(&run_id).await;
    let deltas: Vec<&str> = events
        .iter()
        .filter(|(kind, _)| kind == "delta")
        .filter_map(|(_, data)| data["text"].as_str())
        .collect();
    assert_eq!(deltas.concat(), "Edited: it greets lemons now.", "{events:?}");
    assert!(deltas.len() >= 2, "the answer arrives in pieces: {deltas:?}");
    assert_eq!(
        std::fs::read_to_string(workdir.path().join("greeting.txt")).unwrap(),
        "hello lemons\n"
    );
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    let result = requests[1].last_message_text();
    assert!(result.contains("greeting.txt"), "the edit's result went back: {result}");
    let run = gateway.run(&run_id).await;
    assert_eq!(run["answer"], "Edited: it greets lemons now.", "{run}");
    assert!(!format!("{events:?}{run}").contains(KEY));
    gateway.terminate().await;
}

/// A gateway whose model first runs a command that waits until a file `go`
/// exists in the returned directory, then answers "Limes it is." to a turn
/// that says "use limes instead".
async fn a_gateway_whose_command_waits_for_go(
) -> (tempfile::TempDir, FakeLlm, tempfile::TempDir, Gateway) {
    let workdir = tempfile::tempdir().unwrap();
    let llm = fake_llm().await;
    let wait = json!({ "command": "while [ ! -e go ]; do sleep 0.02; done; echo waited" });
    llm.push(Turn::tool_calls(vec![call("call_wait", "bash", &wait)]));
    llm.rule("use limes instead", Turn::text(&["Limes ", "it is."]));
    let dir = home_for(&llm, "");
    let gateway = Gateway::start_in(dir.path()).await;
    (workdir, llm, dir, gateway)
}

#[tokio::test]
async fn a_message_steered_while_a_command_runs_reaches_the_next_model_turn() {
    let (workdir, llm, _dir, gateway) = a_gateway_whose_command_waits_for_go().await;

    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "pick a fruit", "cwd": cwd })).await;
    let mut live = Live::open(&gateway, &run_id).await;
    live.until("the command's start", tool_started("bash")).await;
    let response = gateway
        .post(&format!("/v1/runs/{run_id}/steer"))
        .json(&json!({ "text": "use limes instead" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["accepted"], true, "{body}");
    // The command is still running: it ends only now.
    std::fs::write(workdir.path().join("go"), "").unwrap();
    live.completed().await;

    let run = gateway.run(&run_id).await;
    assert_eq!(run["answer"], "Limes it is.", "{run}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let second = requests[1].body["messages"].to_string();
    assert!(second.contains("waited"), "the command's output went back: {second}");
    assert_eq!(requests[1].last_message_text(), "use limes instead");
    gateway.terminate().await;
}

/// A session's export with a tool call and a message steered into the live
/// run reads back in order: the run with its command, then the steered
/// message with its answer.
#[tokio::test]
async fn a_session_with_a_tool_and_a_steer_exports_in_order() {
    let (workdir, _llm, _dir, gateway) = a_gateway_whose_command_waits_for_go().await;
    let cwd = workdir.path().to_str().unwrap();
    let session = "export:steer";
    let run_id = gateway
        .submit(json!({ "prompt": "pick a fruit", "cwd": cwd, "session_key": session }))
        .await;
    let mut live = Live::open(&gateway, &run_id).await;
    live.until("the command's start", tool_started("bash")).await;
    let steered = gateway
        .submit(
            json!({ "prompt": "use limes instead", "session_key": session, "queue_mode": "steer" }),
        )
        .await;
    // Taken into the live run or, had it ended first, run after it: either
    // way the steered message is answered by the rule below, after the run.
    std::fs::write(workdir.path().join("go"), "").unwrap();
    live.completed().await;
    assert_eq!(gateway.wait(&steered).await["answer"], "Limes it is.");

    let text = gateway
        .get(&format!("/v1/sessions/{session}/export"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<Value> = text.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(
        (lines[0]["run_id"].as_str(), lines[0]["prompt"].as_str()),
        (Some(run_id.as_str()), Some("pick a fruit"))
    );
    let actions = lines[0]["actions"].as_array().unwrap();
    assert!(
        actions.iter().any(|a| a["kind"] == "command" && a["ok"] == true),
        "the command is in the export: {actions:?}"
    );
    assert_eq!(
        (lines[1]["run_id"].as_str(), lines[1]["prompt"].as_str()),
        (Some(steered.as_str()), Some("use limes instead"))
    );
    assert_eq!(lines[1]["answer"], "Limes it is.");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_long_conversation_is_compacted_and_keeps_going() {
    let llm = fake_llm().await;
    llm.rule("Summarise the conversation above.", Turn::text(&["The user listed fruit."]));
    let dir = home_for(&llm, "context_window = 4000\ntools = [\"read\"]\n");
    let gateway = Gateway::start_in(dir.path()).await;
    let mut last = Value::Null;
    for round in 0..4 {
        let prompt = format!("round {round}: {}", "lemon lime orange ".repeat(222));
        let run_id = gateway.submit(json!({ "prompt": prompt, "session_key": "long" })).await;
        let events = gateway.events(&run_id).await;
        let run = gateway.run(&run_id).await;
        assert_eq!(run["status"], "completed", "round {round}: {run}");
        assert!(run["answer"] == prompt.as_str(), "round {round}: the fake echoes the prompt");
        let compacted = events.iter().any(|(kind, data)| {
            kind == "engine_action"
                && data.to_string().contains("compaction")
                && data.to_string().contains("completed")
        });
        if compacted {
            last = run;
            break;
        }
    }
    assert_ne!(last, Value::Null, "a compaction within four rounds: {:?}", llm.requests());
    let requests = llm.requests();
    let summary = requests
        .iter()
        .position(|r| r.last_message_text().contains("Summarise the conversation above."))
        .expect("a summary request");
    let after = requests[summary + 1].body["messages"].to_string();
    assert!(
        after.contains("The user listed fruit."),
        "the summary replaces the old turns: {after}"
    );
    assert!(!after.contains("round 0:"), "{after}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_run_token_budget_stops_a_native_run_between_turns() {
    let workdir = tempfile::tempdir().unwrap();
    let llm = fake_llm().await;
    llm.push(Turn::tool_calls(vec![call("call_1", "list", &json!({}))]));
    llm.push(Turn::tool_calls(vec![call("call_2", "list", &json!({}))]));
    llm.push(Turn::text(&["never sent"]));
    let dir = home_for(&llm, "[gateway.budgets]\nrun_tokens = 30\n");
    let gateway = Gateway::start_in(dir.path()).await;
    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "list twice", "cwd": cwd })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error_code"], "budget_exceeded", "{run}");
    let error = run["error"].as_str().unwrap();
    assert!(error.contains("run"), "names the limit: {error}");
    assert_eq!(llm.requests().len(), 2, "no third model turn");
    assert_eq!(llm.queued(), 1);
    gateway.terminate().await;
}

/// The process group of `pid`, from `/proc/<pid>/stat`.
fn pgid_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(2)?.parse().ok()
}

/// Whether any process is in group `pgid`.
fn group_alive(pgid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        entry.file_name().to_str().and_then(|n| n.parse().ok()).and_then(pgid_of) == Some(pgid)
    })
}

#[tokio::test]
async fn cancel_kills_a_running_commands_process_group() {
    let workdir = tempfile::tempdir().unwrap();
    let llm = fake_llm().await;
    let sleep = json!({ "command": "echo $$ > shell.pid; sleep 300 & sleep 301; wait" });
    llm.push(Turn::tool_calls(vec![call("call_sleep", "bash", &sleep)]));
    let dir = home_for(&llm, "");
    let gateway = Gateway::start_in(dir.path()).await;
    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "sleep a while", "cwd": cwd })).await;
    let mut live = Live::open(&gateway, &run_id).await;
    live.until("the command's start", tool_started("bash")).await;
    let pid_file = workdir.path().join("shell.pid");
    eventually("the shell's pid", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
    })
    .await;
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    let pgid = pgid_of(pid).expect("the shell runs");
    assert_ne!(pgid, pgid_of(gateway.pid()).unwrap(), "the command has its own group");
    eventually("both sleeps", || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name().to_str().and_then(|n| n.parse().ok()).and_then(pgid_of) == Some(pgid)
            })
            .count()
            >= 3
    })
    .await;

    let response = gateway.post(&format!("/v1/runs/{run_id}/cancel")).send().await.unwrap();
    assert_eq!(response.status(), 202);
    live.completed().await;
    let run = gateway.run(&run_id).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    eventually("the process group gone", || !group_alive(pgid)).await;
    assert_eq!(llm.requests().len(), 1, "no turn after the cancel");
    gateway.terminate().await;
}

#[tokio::test]
async fn reads_outside_the_working_directory_are_refused_to_the_model() {
    let parent = tempfile::tempdir().unwrap();
    let workdir = parent.path().join("project");
    std::fs::create_dir(&workdir).unwrap();
    std::fs::write(parent.path().join("secret.txt"), "outside-contents\n").unwrap();
    let llm = fake_llm().await;
    llm.push(Turn::tool_calls(vec![
        call("call_passwd", "read", &json!({ "path": "/etc/passwd" })),
        call("call_up", "read", &json!({ "path": "../secret.txt" })),
    ]));
    llm.push(Turn::text(&["I may not read those."]));
    let dir = home_for(&llm, "");
    let gateway = Gateway::start_in(dir.path()).await;
    let cwd = workdir.to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "read around", "cwd": cwd })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "I may not read those.", "{run}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let results: Vec<&Value> = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    for result in &results {
        let content = result["content"].to_string();
        assert!(
            content.contains("is outside the working directory and the workspace"),
            "refused: {content}"
        );
    }
    let all = requests[1].body.to_string();
    assert!(!all.contains("root:") && !all.contains("outside-contents"), "{all}");
    gateway.terminate().await;
}

/// Paths the model gives stay inside the run's cwd or the gateway's workspace.
#[tokio::test]
async fn the_workspace_is_readable_by_the_native_tools() {
    let workdir = tempfile::tempdir().unwrap();
    let llm = fake_llm().await;
    let dir = home_for(&llm, "");
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("shared.txt"), "from the workspace\n").unwrap();
    let path = workspace.join("shared.txt");
    llm.push(Turn::tool_calls(vec![call(
        "call_ws",
        "read",
        &json!({ "path": path.to_str().unwrap() }),
    )]));
    llm.push(Turn::text(&["read it"]));
    let gateway = Gateway::start_in(dir.path()).await;
    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "read the shared file", "cwd": cwd })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "read it", "{run}");
    let result = llm.requests()[1].last_message_text();
    assert!(result.contains("from the workspace"), "{result}");
    gateway.terminate().await;
}

/// A 1×1 lemon-yellow PNG.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90\x77\x53\xde\x00\x00\x00\x0cIDAT\x78\x9c\x63\xf8\x7f\x9d\x01\x00\x04\xaf\x01\xd7\xc0\xd0\x10\x3e\x00\x00\x00\x00IEND\xae\x42\x60\x82";

/// The `lemon` engine the gateway builds from `section` (the lines of its
/// `[gateway.engines.lemon]`), with the key and its sessions in `store`.
fn native_engine(
    section: &str,
    store: &lemon_core::store::StoreHandle,
) -> lemon_engines::native::NativeEngine {
    let sections =
        crate::cli_support::sections_from(&format!("[gateway.engines.lemon]\n{section}"));
    let ctx = lemon_engines::cli::CliContext {
        api_keys: [("lemon".to_owned(), lemon_engines::cli::ApiKey::new(KEY))].into(),
        store: Some(store.clone()),
        ..lemon_engines::cli::CliContext::default()
    };
    lemon_engines::native::build(&sections, &ctx).expect("lemon is enabled")
}

/// A run of `engine` on `prompt` with `attachments` (resuming `session`), to
/// its completion; the session it ran in.
async fn run_native(
    engine: &lemon_engines::native::NativeEngine,
    prompt: &str,
    attachments: Vec<lemon_core::media::Attachment>,
    session: Option<&str>,
) -> String {
    use lemon_core::engine::{Engine, EngineEvent, EventSink, ResumeToken, StartRequest};
    let req = StartRequest {
        run_id: lemon_core::ids::RunId::generate(),
        session_key: "telegram:photos".into(),
        prompt: prompt.to_owned(),
        resume: session.map(|id| ResumeToken::new("lemon", id)),
        cwd: std::env::temp_dir(),
        model: None,
        meta: Default::default(),
        workspace: None,
        off_limits: lemon_core::contain::OffLimits::none(),
        attachments,
    };
    let (sink, mut rx) = EventSink::channel(64);
    let _control = engine.start(req, sink).await.expect("the run starts");
    let mut session = None;
    tokio::time::timeout(PATIENCE, async {
        while let Some(event) = rx.recv().await {
            match event {
                EngineEvent::Started { resume: Some(token), .. } => session = Some(token.value),
                EngineEvent::Completed(done) => {
                    assert!(done.ok, "{done:?}");
                    break;
                }
                _ => {}
            }
        }
    })
    .await
    .expect("the run completes in time");
    session.expect("the run names its session")
}

/// `PNG` saved in a fresh uploads directory, as the gateway places a photo.
fn placed_photo() -> (tempfile::TempDir, lemon_core::media::Attachment) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap().join("photo-1.png");
    std::fs::write(&path, PNG).unwrap();
    let attachment = lemon_core::media::Attachment {
        kind: lemon_core::media::AttachmentKind::Image,
        path,
        name: "photo-1.png".to_owned(),
        mime: "image/png".to_owned(),
        bytes: PNG.len() as u64,
        uploads_dir: None,
    };
    (dir, attachment)
}

#[tokio::test]
async fn a_photo_reaches_the_model_in_each_wire_protocol_and_again_when_the_session_resumes() {
    use lemon_tests::fake_llm::ReceivedImage;
    let llm = fake_llm().await;
    let png = ReceivedImage { mime: "image/png".to_owned(), bytes: PNG.to_vec() };
    for (provider, base_url) in [
        ("openai", llm.base_url()),
        ("openai-responses", llm.base_url()),
        ("anthropic", llm.root_url()),
    ] {
        let store = lemon_core::store::StoreHandle::memory();
        let section = format!(
            "provider = \"{provider}\"\nbase_url = \"{base_url}\"\nmodel = \"test-model\"\n"
        );
        let (_dir, photo) = placed_photo();
        llm.push(Turn::text(&["A yellow ", "pixel."]));
        let engine = native_engine(&section, &store);
        let session = run_native(&engine, "what colour is this?", vec![photo], None).await;
        let first = llm.requests().last().unwrap().clone();
        assert_eq!(first.images(), std::slice::from_ref(&png), "{provider}");
        assert_eq!(first.last_message_text(), "what colour is this?", "{provider}");

        // Another engine on the same store, as after a restart: a later turn
        // of the session still shows the model the picture.
        llm.push(Turn::text(&["Still yellow."]));
        let again = native_engine(&section, &store);
        run_native(&again, "and now?", Vec::new(), Some(&session)).await;
        assert_eq!(
            llm.last_images(),
            std::slice::from_ref(&png),
            "{provider}: the resumed session"
        );
        assert_eq!(llm.requests().last().unwrap().last_message_text(), "and now?");

        // With `vision = false` the request carries no image at all.
        let (_dir, photo) = placed_photo();
        llm.push(Turn::text(&["I can read its path."]));
        let blind = native_engine(&format!("{section}vision = false\n"), &store);
        run_native(&blind, "what colour is this?", vec![photo], None).await;
        let body = llm.requests().last().unwrap().body.to_string();
        assert!(llm.last_images().is_empty(), "{provider}: {body}");
        assert!(!body.contains("base64"), "{provider}: {body}");
    }
}

/// The control API's attachments end to end: the image is saved in the run's
/// directory and shown to the model as an image block with its bytes.
#[tokio::test]
async fn an_image_attached_to_a_run_reaches_the_model_with_its_bytes() {
    use base64::Engine as _;
    use lemon_tests::fake_llm::ReceivedImage;
    let workdir = tempfile::tempdir().unwrap();
    let llm = fake_llm().await;
    llm.push(Turn::text(&["A yellow pixel."]));
    let dir = home_with(&lemon_config(&llm.base_url()));
    write_key(dir.path());
    let gateway = Gateway::start_in(dir.path()).await;
    let data = base64::engine::general_purpose::STANDARD.encode(PNG);
    let body = json!({
        "prompt": "what colour is this?",
        "cwd": workdir.path(),
        "attachments": [{ "name": "pixel.png", "data": data }],
    });
    let run_id = gateway.submit(body).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "A yellow pixel.", "{run}");
    let png = ReceivedImage { mime: "image/png".to_owned(), bytes: PNG.to_vec() };
    assert_eq!(llm.last_images(), [png]);
    let saved = workdir.path().join(".lemon/uploads/pixel.png");
    assert_eq!(std::fs::read(saved).unwrap(), PNG);
    gateway.terminate().await;
}
