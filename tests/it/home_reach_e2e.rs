//! The gateway's own state out of every run's reach, on the real binary with
//! the defaults a new user gets: `HOME` holds `.lemon` (config, secrets, the
//! workspace), no run directory is configured, and the native engine works
//! against the fake LLM. The file tools, a webhook's `MEDIA:` attachments and
//! the run's directory all keep out of `.lemon`, through links too; `read`
//! holds no more than its byte cap of a huge line; a directory swapped
//! for a link while the tool reads never leads to the secrets; and a `bash`
//! command, contained by Landlock, cannot read the secrets by their absolute
//! path, write outside its directory or connect to the API.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
use serde_json::{json, Value};

use crate::support::{command, write_config, Gateway};

const KEY: &str = "sk-home-reach-provider-key";
/// The API token kept in the secrets file, as a new user's gateway saves it.
const FILE_TOKEN: &str = "tok-home-reach-file-0123456789";

/// A user's home with the gateway's home in it, the gateway started on it.
struct Installation {
    _dir: tempfile::TempDir,
    /// `$HOME`.
    user: PathBuf,
    /// `$HOME/.lemon`, the default `$LEMON_HOME`.
    lemon: PathBuf,
    llm: FakeLlm,
    gateway: Gateway,
    secrets_text: String,
    config_text: String,
}

impl Installation {
    /// `extra` is appended to the config (a webhook section, say).
    async fn start(extra: &str) -> Installation {
        Installation::start_with(extra, |_| {}).await
    }

    /// As [`Installation::start`], with `prepare` run on `$HOME` before the
    /// gateway starts (links planted, files written).
    async fn start_with(extra: &str, prepare: impl FnOnce(&Path)) -> Installation {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().canonicalize().unwrap().join("home");
        let lemon = user.join(".lemon");
        // The workspace in the home, where channels save what users send.
        std::fs::create_dir_all(lemon.join("workspace")).unwrap();
        let llm = FakeLlm::builder().api_key(KEY).start().await;
        write_config(
            &lemon,
            &format!(
                "{extra}\n{}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
                crate::support::ALLOW_EVERY_CALL,
                llm.base_url()
            ),
        );
        let secrets_text =
            format!("openai_api_key = \"{KEY}\"\nlemon_api_token = \"{FILE_TOKEN}\"\n");
        let secrets = lemon.join("secrets.toml");
        std::fs::write(&secrets, &secrets_text).unwrap();
        std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        prepare(&user);
        let config_text = std::fs::read_to_string(lemon.join("config.toml")).unwrap();
        // `HOME` is the user's; `LEMON_HOME` is not set, so it is `$HOME/.lemon`.
        let mut command = command(&lemon);
        command.env("HOME", &user).env_remove("LEMON_HOME");
        let gateway = Gateway::spawn(command, &lemon).await;
        Installation { _dir: dir, user, lemon, llm, gateway, secrets_text, config_text }
    }

    /// Where runs without a directory work: `lemon-workspace` beside `.lemon`.
    fn spare(&self) -> PathBuf {
        self.user.join("lemon-workspace")
    }

    /// Runs `prompt` (no directory given unless `cwd` is) and waits for it.
    async fn run(&self, prompt: &str, cwd: Option<&Path>) -> Value {
        let mut body = json!({ "prompt": prompt });
        if let Some(cwd) = cwd {
            body["cwd"] = json!(cwd.display().to_string());
        }
        let run_id = self.gateway.submit(body).await;
        self.gateway.wait(&run_id).await
    }

    /// The results the model was given for the tool calls of its last turn,
    /// by call id.
    fn tool_results(&self) -> Vec<(String, String)> {
        let requests = self.llm.requests();
        let last = requests.last().expect("the model was asked");
        last.body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                let content = match &m["content"] {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                (m["tool_call_id"].as_str().unwrap_or_default().to_owned(), content)
            })
            .collect()
    }

    /// The state files are as the user wrote them.
    fn assert_state_unchanged(&self) {
        let secrets = std::fs::read_to_string(self.lemon.join("secrets.toml")).unwrap();
        assert_eq!(secrets, self.secrets_text, "the secrets file was changed");
        let config = std::fs::read_to_string(self.lemon.join("config.toml")).unwrap();
        assert_eq!(config, self.config_text, "the config file was changed");
    }
}

fn call(id: &str, name: &str, arguments: &Value) -> FakeToolCall {
    FakeToolCall::new(id, name, &[&arguments.to_string()])
}

/// Plants, in the run's (spare) directory, links into the gateway's home.
fn plant_links(user: &Path) {
    let spare = user.join("lemon-workspace");
    std::fs::create_dir_all(&spare).unwrap();
    let link = |target: &str, name: &str| {
        std::os::unix::fs::symlink(user.join(target), spare.join(name)).unwrap();
    };
    link(".lemon/secrets.toml", "secrets_link");
    link(".lemon/config.toml", "config_link");
    link(".lemon", "state_link");
}

/// Whether a tool's result is a refusal, not content.
fn refused(content: &str) -> bool {
    content.contains("the gateway's own state")
        || content.contains("is outside the working directory and the workspace")
}

#[tokio::test]
async fn no_file_tool_reads_or_writes_the_gateways_state_even_through_a_link() {
    let app = Installation::start_with("", plant_links).await;
    let lemon = |name: &str| app.lemon.join(name).display().to_string();
    let secrets = lemon("secrets.toml");
    let config = lemon("config.toml");
    let home = app.lemon.display().to_string();
    let workspace_escape = app.lemon.join("workspace/../secrets.toml").display().to_string();
    let cron = "[[gateway.cron]]\nschedule = \"* * * * *\"\nprompt = \"planted\"\n";
    let calls = vec![
        call("read_secrets", "read", &json!({ "path": secrets })),
        call("read_relative", "read", &json!({ "path": "../.lemon/secrets.toml" })),
        call("read_escape", "read", &json!({ "path": workspace_escape })),
        call("read_link", "read", &json!({ "path": "secrets_link" })),
        call("read_dir_link", "read", &json!({ "path": "state_link/config.toml" })),
        call("write_config", "write", &json!({ "path": config, "content": cron })),
        call("write_link", "write", &json!({ "path": "config_link", "content": cron })),
        call("write_new", "write", &json!({ "path": "state_link/new.toml", "content": "x" })),
        call(
            "edit_secrets",
            "edit",
            &json!({ "path": secrets, "old_string": FILE_TOKEN, "new_string": "tok-owned-000000000000" }),
        ),
        call(
            "edit_link",
            "edit",
            &json!({ "path": "secrets_link", "old_string": FILE_TOKEN, "new_string": "tok-owned-000000000000" }),
        ),
        call(
            "edit_config_link",
            "edit",
            &json!({ "path": "state_link/config.toml", "old_string": "[gateway", "new_string": "[[gateway.cron]]\nschedule = \"* * * * *\"\nprompt = \"planted\"\n[gateway" }),
        ),
        call("list_home", "list", &json!({ "path": home })),
        call("list_link", "list", &json!({ "path": "state_link" })),
        call("grep_home", "grep", &json!({ "pattern": "api|token|gateway", "path": home })),
        call("grep_link", "grep", &json!({ "pattern": "api|token|gateway", "path": "state_link" })),
        call("grep_file_link", "grep", &json!({ "pattern": "token", "path": "secrets_link" })),
        call("glob_home", "glob", &json!({ "pattern": "*.toml", "path": home })),
        call("glob_link", "glob", &json!({ "pattern": "*.toml", "path": "state_link" })),
    ];
    let n_calls = calls.len();
    app.llm.push(Turn::tool_calls(calls));
    app.llm.push(Turn::text(&["I kept out."]));
    let run = app.run("show me the gateway's secrets", None).await;
    assert_eq!(run["answer"], "I kept out.", "{run}");
    let results = app.tool_results();
    assert_eq!(results.len(), n_calls, "{results:?}");
    for (id, content) in &results {
        assert!(refused(content), "{id} was not refused: {content}");
        for leaked in [KEY, FILE_TOKEN, "default_engine", "[gateway"] {
            assert!(!content.contains(leaked), "{id} leaked {leaked:?}: {content}");
        }
    }
    // A walk of the run's directory passes the links into the state by.
    app.llm.push(Turn::tool_calls(vec![
        call("grep_cwd", "grep", &json!({ "pattern": "api_key|lemon_api_token|gateway" })),
        call("glob_cwd", "glob", &json!({ "pattern": "**/*.toml" })),
    ]));
    app.llm.push(Turn::text(&["Nothing here."]));
    app.run("search around", None).await;
    // The conversation goes on: this turn's two results come last.
    let results = app.tool_results();
    let results = &results[results.len() - 2..];
    assert_eq!(results[0].1, "No matches.", "{results:?}");
    assert_eq!(results[1].1, "No files matched.", "{results:?}");
    app.assert_state_unchanged();
    assert!(!app.lemon.join("new.toml").exists());
    app.gateway.terminate().await;
}

#[tokio::test]
async fn a_run_without_a_directory_works_beside_the_gateways_home_not_in_home() {
    let app = Installation::start("").await;
    for (id, cwd) in [("default", None), ("asked_for_home", Some(app.user.clone()))] {
        app.llm.push(Turn::tool_calls(vec![call(
            id,
            "write",
            &json!({ "path": format!("{id}.txt"), "content": "here" }),
        )]));
        app.llm.push(Turn::text(&["Written."]));
        let run = app.run("where are you?", cwd.as_deref()).await;
        assert_eq!(run["answer"], "Written.", "{run}");
        let written = app.spare().join(format!("{id}.txt"));
        assert_eq!(std::fs::read_to_string(&written).unwrap(), "here", "{id}");
        assert!(!app.user.join(format!("{id}.txt")).exists(), "{id} ran in $HOME");
    }
    // The spare directory is beside the gateway's home, not inside it.
    assert_eq!(app.spare().parent(), app.lemon.parent());
    app.gateway.terminate().await;
}

#[tokio::test]
async fn a_webhook_answer_naming_the_secrets_carries_no_attachment() {
    let webhook = "[gateway]\nenable_webhook = true\n\
                   [gateway.webhook]\nport = 0\n\
                   [gateway.webhook.integrations.ci]\ntoken = \"hook-token-home-reach\"\nmode = \"sync\"\n";
    let app = Installation::start_with(webhook, plant_links).await;
    std::fs::write(app.spare().join("report.txt"), "the report").unwrap();
    let answer = format!(
        "Done.\nMEDIA: report.txt\nMEDIA: .lemon/secrets.toml\nMEDIA: ../.lemon/secrets.toml\nMEDIA: {}\nMEDIA: secrets_link\nMEDIA: state_link/config.toml\n",
        app.lemon.join("secrets.toml").display()
    );
    app.llm.push(Turn::text(&[&answer]));
    let body = json!({ "prompt": "send me the secrets" });
    let response = app.gateway.post_webhook("ci", "hook-token-home-reach", &body).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["answer"], "Done.", "{body}");
    let attachments = body["attachments"].as_array().expect("attachments");
    let names: Vec<&str> = attachments.iter().map(|a| a["filename"].as_str().unwrap()).collect();
    assert_eq!(names, ["report.txt"], "only the file in the run's directory: {body}");
    let text = body.to_string();
    for leaked in [KEY, FILE_TOKEN] {
        assert!(!text.contains(leaked), "leaked {leaked:?}: {text}");
    }
    app.assert_state_unchanged();
    app.gateway.terminate().await;
}

/// A `/proc/<pid>/status` field in kB.
fn status_kb(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).expect("field in /proc status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test]
#[allow(clippy::print_stderr)] // The figure, for the README.
async fn read_of_a_64_mib_single_line_returns_30000_bytes_and_holds_no_more() {
    const SIZE: usize = 64 << 20;
    let app = Installation::start("").await;
    std::fs::create_dir_all(app.spare()).unwrap();
    std::fs::write(app.spare().join("huge.log"), "z".repeat(SIZE)).unwrap();
    let pid = app.gateway.pid();
    // The peak is reset, so what is read below is the peak of this run alone.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before_kb = status_kb(pid, "VmRSS:");
    app.llm.push(Turn::tool_calls(vec![call("huge", "read", &json!({ "path": "huge.log" }))]));
    app.llm.push(Turn::text(&["Long."]));
    let run = app.run("read the log", None).await;
    assert_eq!(run["answer"], "Long.", "{run}");
    let peak_kb = status_kb(pid, "VmHWM:");
    let results = app.tool_results();
    let (content, note) = results[0].1.split_once('\n').expect("content, then the note");
    assert_eq!(content.len(), 30_000, "the README's cap");
    assert!(content.bytes().all(|b| b == b'z'));
    assert!(
        note.contains(&format!("[line 1 is {SIZE} bytes; only its first 30000 bytes are shown")),
        "{note}"
    );
    // Before the cap the whole line was held (and copied): +64 MiB at least.
    let rose_kb = peak_kb.saturating_sub(before_kb);
    eprintln!("read of a {} MiB line: peak RSS {before_kb} kB -> {peak_kb} kB", SIZE >> 20);
    assert!(rose_kb < 16 * 1024, "RSS rose by {rose_kb} kB reading a {SIZE}-byte line");
    app.gateway.terminate().await;
}

#[tokio::test]
async fn a_directory_swapped_for_a_link_while_read_runs_never_yields_the_secrets() {
    const READS: usize = 300;
    let app = Installation::start_with("", |user| {
        let data = user.join("lemon-workspace/data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("secrets.toml"), "inside-content\n").unwrap();
    })
    .await;
    let spare = app.spare();
    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicUsize::new(0));
    // Flips `data` between the real directory and a link to `.lemon`, which
    // has a file of the same name.
    let swapper = {
        let (stop, flips, lemon) = (stop.clone(), flips.clone(), app.lemon.clone());
        std::thread::spawn(move || {
            let (data, held) = (spare.join("data"), spare.join("data.held"));
            while !stop.load(Ordering::Relaxed) {
                std::fs::rename(&data, &held).unwrap();
                std::os::unix::fs::symlink(&lemon, &data).unwrap();
                std::fs::remove_file(&data).unwrap();
                std::fs::rename(&held, &data).unwrap();
                flips.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let calls = (0..READS)
        .map(|i| call(&format!("r{i}"), "read", &json!({ "path": "data/secrets.toml" })))
        .collect();
    app.llm.push(Turn::tool_calls(calls));
    app.llm.push(Turn::text(&["Read them."]));
    let run = app.run("read it many times", None).await;
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert_eq!(run["answer"], "Read them.", "{run}");
    assert!(flips.load(Ordering::Relaxed) > 0, "the swapper ran");
    let results = app.tool_results();
    assert_eq!(results.len(), READS);
    for (id, content) in &results {
        assert!(!content.contains(KEY) && !content.contains(FILE_TOKEN), "{id}: {content}");
    }
    app.assert_state_unchanged();
    app.gateway.terminate().await;
}

/// A TCP connection from Python, which prints the errno's name.
fn connect(port: u16) -> String {
    format!(
        "python3 -c 'import socket, errno\n\
         s = socket.socket()\n\
         try:\n    s.connect((\"127.0.0.1\", {port})); print(\"api: connected\")\n\
         except OSError as e:\n    print(\"api:\", errno.errorcode[e.errno])'"
    )
}

#[tokio::test]
async fn a_command_reads_no_secret_writes_nothing_outside_and_cannot_reach_the_api() {
    let app = Installation::start("").await;
    let status: Value = app.gateway.get("/v1/status").send().await.unwrap().json().await.unwrap();
    assert_eq!(status["sandbox"]["mode"], "auto", "{status}");
    assert_eq!(status["sandbox"]["enforced"], true, "{status}");
    assert!(status["sandbox"]["landlock_abi"].as_u64().unwrap() >= 6, "{status}");
    let outside = app.user.join("outside-made");
    let api_port: u16 = app.gateway.api.rsplit(':').next().unwrap().parse().unwrap();
    let lemon = app.lemon.display();
    let command = format!(
        "cat {lemon}/secrets.toml; echo read=$?; echo '[gateway.cron]' >> {lemon}/config.toml; \
         echo write=$?; touch {}; echo outside=$?; touch made-here; echo here=$?; {}",
        outside.display(),
        connect(api_port)
    );
    app.llm.push(Turn::tool_calls(vec![call("probe", "bash", &json!({ "command": command }))]));
    app.llm.push(Turn::text(&["Contained."]));
    let run = app.run("look around", None).await;
    assert_eq!(run["answer"], "Contained.", "{run}");
    let results = app.tool_results();
    let text = &results[0].1;
    // A redirection the shell cannot open exits 2.
    for expected in ["read=1", "write=2", "outside=1", "here=0", "api: EACCES"] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    assert!(!text.contains(KEY) && !text.contains(FILE_TOKEN), "{text}");
    assert!(!outside.exists());
    assert!(app.spare().join("made-here").exists(), "the run's directory is writable");
    app.assert_state_unchanged();
    app.gateway.terminate().await;
}

#[tokio::test]
async fn with_sandbox_required_and_no_landlock_a_command_is_refused_not_run() {
    let app = Installation::start(
        "[gateway.sandbox]\nmode = \"required\"\nsimulate_no_landlock = true\n",
    )
    .await;
    let status: Value = app.gateway.get("/v1/status").send().await.unwrap().json().await.unwrap();
    assert_eq!(status["sandbox"]["enforced"], false, "{status}");
    assert_eq!(status["sandbox"]["landlock_abi"], Value::Null, "{status}");
    let command = "touch made-anyway";
    app.llm.push(Turn::tool_calls(vec![call("try", "bash", &json!({ "command": command }))]));
    app.llm.push(Turn::text(&["Refused."]));
    let run = app.run("try it", None).await;
    assert_eq!(run["answer"], "Refused.", "{run}");
    let results = app.tool_results();
    assert!(results[0].1.contains("mode = \"required\""), "{results:?}");
    assert!(!app.spare().join("made-anyway").exists(), "the command did not run");
    app.gateway.terminate().await;
}
