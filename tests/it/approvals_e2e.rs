//! Approvals on the real binary: the native engine's tool calls judged by
//! `[gateway.approvals]`, an asked call waiting for an answer through
//! `/v1/approvals`, approved (it runs), denied, expired, answered twice, and
//! withdrawn by a cancel; every decision in the run's events.

use futures::StreamExt;
use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
use serde_json::{json, Value};

use crate::support::{home_with, Gateway, PATIENCE};

const KEY: &str = "sk-approvals-provider-key";

/// `rm` is denied outright, every other command is asked about.
const RULES: &str =
    "[[gateway.approvals.rules]]\ntool = \"bash\"\nmatch = \"rm *\"\naction = \"deny\"\n\
                     [[gateway.approvals.rules]]\ntool = \"bash\"\naction = \"ask\"\n";

struct App {
    llm: FakeLlm,
    gateway: Gateway,
    _home: tempfile::TempDir,
    work: tempfile::TempDir,
}

async fn start(extra: &str) -> App {
    start_with(RULES, extra).await
}

/// A gateway with `rules` as its `[gateway.approvals]` rules ("": the defaults).
async fn start_with(rules: &str, extra: &str) -> App {
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    let home = home_with(&format!(
        "{rules}{extra}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
        llm.base_url()
    ));
    std::fs::write(home.path().join("secrets.toml"), format!("openai_api_key = \"{KEY}\"\n"))
        .unwrap();
    let gateway = Gateway::start_in(home.path()).await;
    App { llm, gateway, _home: home, work: tempfile::tempdir().unwrap() }
}

impl App {
    /// Starts a run whose model asks for `command`, then says `answer`.
    async fn run_command(&self, command: &str, answer: &str) -> String {
        let call =
            FakeToolCall::new("call_1", "bash", &[&json!({ "command": command }).to_string()]);
        self.llm.push(Turn::tool_calls(vec![call]));
        self.llm.push(Turn::text(&[answer]));
        let cwd = self.work.path().display().to_string();
        self.gateway.submit(json!({ "prompt": "do it", "cwd": cwd })).await
    }

    fn made(&self, name: &str) -> bool {
        self.work.path().join(name).exists()
    }

    /// The text the model was given for its tool call.
    fn tool_result(&self) -> String {
        tool_result(&self.llm)
    }

    async fn decide(&self, id: &str, decision: &str) -> (u16, Value) {
        let response = self
            .gateway
            .post(&format!("/v1/approvals/{id}"))
            .json(&json!({ "decision": decision }))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn pending(&self) -> Vec<Value> {
        let body: Value =
            self.gateway.get("/v1/approvals").send().await.unwrap().json().await.unwrap();
        body["approvals"].as_array().unwrap().clone()
    }
}

/// The text the model was given for its tool call, in its last request.
fn tool_result(llm: &FakeLlm) -> String {
    let requests = llm.requests();
    let last = requests.last().expect("the model was asked");
    let messages = last.body["messages"].as_array().unwrap();
    let tool = messages.iter().find(|m| m["role"] == "tool").expect("a tool result");
    tool["content"].as_str().map_or_else(|| tool["content"].to_string(), str::to_owned)
}

/// Reads the run's events until its approval request arrives; the request.
pub(crate) async fn until_asked(gateway: &Gateway, run_id: &str) -> Value {
    until_asked_within(gateway, run_id, PATIENCE).await
}

/// [`until_asked`], waiting up to `patience` (a real CLI takes longer).
pub(crate) async fn until_asked_within(
    gateway: &Gateway,
    run_id: &str,
    patience: std::time::Duration,
) -> Value {
    let response = gateway.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut stream = response.bytes_stream();
    tokio::time::timeout(patience, async {
        while let Some(chunk) = stream.next().await {
            for event in parser.push(&chunk.unwrap()) {
                let data: Value = serde_json::from_str(&event.data).unwrap();
                let action = &data["action"];
                if action["kind"] == "approval" && action["phase"] == "started" {
                    return action["detail"]["approval"].clone();
                }
                assert_ne!(event.event, "run_completed", "the run ended unasked: {data}");
            }
        }
        panic!("the event stream ended before the request");
    })
    .await
    .expect("the approval request arrives")
}

/// The run's approval actions, completed.
async fn settled(gateway: &Gateway, run_id: &str) -> Vec<Value> {
    gateway
        .events(run_id)
        .await
        .into_iter()
        .map(|(_, data)| data["action"].clone())
        .filter(|action| action["kind"] == "approval" && action["phase"] == "completed")
        .collect()
}

#[tokio::test]
async fn an_asked_command_runs_once_approved_and_a_second_answer_is_refused() {
    let app = start("").await;
    let run_id = app.run_command("touch approved-file", "Done.").await;
    let request = until_asked(&app.gateway, &run_id).await;
    assert_eq!(request["tool"], "bash");
    assert_eq!(request["subject"], "touch approved-file");
    assert_eq!(request["rule"], "tool = \"bash\", action = \"ask\"");
    assert_eq!(request["run_id"], run_id.as_str());
    let id = request["id"].as_str().unwrap();
    assert_eq!(app.pending().await, vec![request.clone()]);
    assert!(!app.made("approved-file"), "nothing runs before the answer");

    let (status, body) = app.decide(id, "approve").await;
    assert_eq!(status, 200, "{body}");
    let run = app.gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "Done.", "{run}");
    assert!(app.made("approved-file"));
    assert!(app.tool_result().contains("[exit code 0]"), "{}", app.tool_result());

    let (status, body) = app.decide(id, "deny").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], format!("approval request {id} was already approved by api via api"));
    let decisions = settled(&app.gateway, &run_id).await;
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!(decisions[0]["ok"], true);
    assert_eq!(decisions[0]["message"], "approved by api via api");
    assert!(app.pending().await.is_empty());
    app.gateway.terminate().await;
}

/// Out of the box, with no rules written: reads run unasked, and the first
/// command waits for the owner.
#[tokio::test]
async fn by_default_a_read_runs_unasked_and_a_command_waits_for_the_owner() {
    let app = start_with("", "").await;
    std::fs::write(app.work.path().join("notes.txt"), "kept in notes").unwrap();
    let call =
        |id: &str, tool: &str, input: Value| FakeToolCall::new(id, tool, &[&input.to_string()]);
    app.llm.push(Turn::tool_calls(vec![call("call_r", "read", json!({ "path": "notes.txt" }))]));
    app.llm.push(Turn::tool_calls(vec![call(
        "call_b",
        "bash",
        json!({ "command": "touch made" }),
    )]));
    app.llm.push(Turn::text(&["Done."]));
    let cwd = app.work.path().display().to_string();
    let run_id = app.gateway.submit(json!({ "prompt": "read, then make", "cwd": cwd })).await;

    let request = until_asked(&app.gateway, &run_id).await;
    assert_eq!(request["tool"], "bash", "the read was not asked about: {request}");
    assert_eq!(request["rule"], "tool = \"*\", action = \"ask\"");
    assert!(app.llm.requests()[1].body.to_string().contains("kept in notes"), "the read ran");
    assert!(!app.made("made"), "nothing runs before the answer");
    let (status, body) = app.decide(request["id"].as_str().unwrap(), "approve").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(app.gateway.wait(&run_id).await["answer"], "Done.");
    assert!(app.made("made"));
    app.gateway.terminate().await;
}

/// A project's rules apply to runs in its directory, an engine's to its runs,
/// both before the owner's; a caller cannot claim a bound chat's rules
/// through its own `meta.channel`.
#[tokio::test]
async fn a_projects_and_an_engines_rules_come_before_the_owners() {
    let site = tempfile::tempdir().unwrap();
    let scopes = format!(
        "[gateway.approvals.engines]\nlemon = [{{ tool = \"bash\", match = \"touch engine-*\", action = \"allow\" }}]\n\
         [gateway.projects.site]\nroot = \"{}\"\napprovals = [{{ tool = \"bash\", match = \"touch *\", action = \"allow\" }}]\n\
         [[gateway.bindings]]\ntransport = \"telegram\"\nchat_id = 7\napprovals = [{{ tool = \"bash\", action = \"allow\" }}]\n",
        site.path().display()
    );
    let app = start(&scopes).await;
    let command = |command: &str| {
        FakeToolCall::new("call_1", "bash", &[&json!({ "command": command }).to_string()])
    };
    // In the project's directory: its rule allows the touch, unasked.
    app.llm.push(Turn::tool_calls(vec![command("touch in-site")]));
    app.llm.push(Turn::text(&["Made."]));
    let cwd = site.path().display().to_string();
    let run_id = app.gateway.submit(json!({ "prompt": "make it", "cwd": cwd })).await;
    assert_eq!(app.gateway.wait(&run_id).await["answer"], "Made.");
    assert!(site.path().join("in-site").exists());
    // The engine's rule, wherever the run is.
    let run_id = app.run_command("touch engine-rule", "Touched.").await;
    assert_eq!(app.gateway.wait(&run_id).await["answer"], "Touched.");
    assert!(app.made("engine-rule"));
    // Elsewhere the owner's rules ask, whatever channel the caller claims.
    app.llm.push(Turn::tool_calls(vec![command("touch outside")]));
    app.llm.push(Turn::text(&["Asked."]));
    let cwd = app.work.path().display().to_string();
    let claimed = json!({ "transport": "telegram", "chat_id": "7", "topic_id": null });
    let run_id = app
        .gateway
        .submit(json!({ "prompt": "make it", "cwd": cwd, "meta": { "channel": claimed } }))
        .await;
    let request = until_asked(&app.gateway, &run_id).await;
    assert_eq!(request["rule"], "tool = \"bash\", action = \"ask\"", "{request}");
    app.decide(request["id"].as_str().unwrap(), "deny").await;
    let run = app.gateway.wait(&run_id).await;
    assert!(run["meta"].get("channel").is_none(), "{run}");
    assert!(!app.made("outside"));
    app.gateway.terminate().await;
}

#[tokio::test]
async fn a_denied_command_is_not_run_and_the_model_is_told() {
    let app = start("").await;
    let run_id = app.run_command("touch denied-file", "Understood.").await;
    let request = until_asked(&app.gateway, &run_id).await;
    let (status, _) = app.decide(request["id"].as_str().unwrap(), "deny").await;
    assert_eq!(status, 200);
    let run = app.gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "Understood.", "{run}");
    assert!(!app.made("denied-file"));
    assert_eq!(app.tool_result(), "The owner denied this call (api via api); it was not run.");
    let decisions = settled(&app.gateway, &run_id).await;
    assert_eq!(decisions[0]["ok"], false);
    assert_eq!(decisions[0]["message"], "denied by api via api");
    app.gateway.terminate().await;
}

#[tokio::test]
async fn a_rule_that_denies_refuses_without_asking() {
    let app = start("").await;
    std::fs::write(app.work.path().join("keep"), "").unwrap();
    let run_id = app.run_command("rm keep", "Fine.").await;
    let run = app.gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "Fine.", "{run}");
    assert!(app.made("keep"));
    assert_eq!(
        app.tool_result(),
        "The owner's policy denies this call (tool = \"bash\", match = \"rm *\", action = \"deny\"); it was not run."
    );
    assert!(settled(&app.gateway, &run_id).await.is_empty(), "nothing was asked");
    app.gateway.terminate().await;
}

#[tokio::test]
async fn an_unanswered_request_expires_denied() {
    let app = start("[gateway.approvals]\ntimeout_ms = 1000\n").await;
    let run_id = app.run_command("touch late-file", "Nobody answered.").await;
    let run = app.gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "Nobody answered.", "{run}");
    assert!(!app.made("late-file"));
    assert_eq!(
        app.tool_result(),
        "Nobody answered the approval request within 1 seconds, so the call was denied and not run."
    );
    let decisions = settled(&app.gateway, &run_id).await;
    assert_eq!(decisions[0]["message"], "no answer within 1 s: denied");
    let id = decisions[0]["detail"]["approval"]["id"].as_str().unwrap();
    let (status, body) = app.decide(id, "approve").await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().ends_with("expired without an answer"), "{body}");
    app.gateway.terminate().await;
}

#[tokio::test]
async fn a_run_cancelled_while_it_waits_ends_at_once_and_withdraws_its_request() {
    let app = start("").await;
    let run_id = app.run_command("touch never-file", "unused").await;
    let request = until_asked(&app.gateway, &run_id).await;
    let cancel = app.gateway.post(&format!("/v1/runs/{run_id}/cancel")).send().await.unwrap();
    assert_eq!(cancel.status(), 202);
    let run = app.gateway.wait(&run_id).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    assert!(app.pending().await.is_empty());
    let (status, body) = app.decide(request["id"].as_str().unwrap(), "approve").await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("the run ended while it waited"), "{body}");
    assert!(!app.made("never-file"));
    app.gateway.terminate().await;
}

#[tokio::test]
async fn bad_answers_are_clear_errors() {
    let app = start("").await;
    let (status, body) = app.decide("apr_000000000000", "approve").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"], "no approval request apr_000000000000");
    let (status, body) = app.decide("apr_000000000000", "maybe").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"],
        "decision must be \"approve\", \"deny\" or \"always\", not \"maybe\""
    );
    // A token holder names the surface it answers from, never a chat's.
    let response = app
        .gateway
        .post("/v1/approvals/apr_000000000000")
        .json(&json!({ "decision": "approve", "via": "telegram" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body["error"],
        "via must be \"api\", \"dashboard\" or \"desktop\", not \"telegram\""
    );
    app.gateway.terminate().await;
}

/// `lemon-gateway` with `args`, against `app`'s gateway; its stdout.
async fn cli(app: &App, args: &[&str]) -> (bool, String) {
    let mut command = crate::support::command(&app.gateway.home);
    command.env("LEMON_URL", &app.gateway.api).args(args);
    crate::support::output_text(command).await
}

#[tokio::test]
async fn the_command_line_tests_rules_lists_requests_and_approves_one() {
    let binding = "[[gateway.bindings]]\ntransport = \"telegram\"\nchat_id = 42\n\
                   approvals = [{ tool = \"bash\", match = \"make *\", action = \"allow\" }]\n";
    let app = start(binding).await;
    let (_, text) =
        cli(&app, &["approvals", "test", "bash: make html", "--chat", "telegram:42"]).await;
    assert_eq!(
        text.trim(),
        "allow: rule 1 (binding telegram:42: tool = \"bash\", match = \"make *\", action = \"allow\")\n\
         untrusted runs: ask: rule 3 (untrusted: tool = \"*\", action = \"ask\")",
        "a binding loosens a trusted run only"
    );
    let (_, text) = cli(&app, &["approvals", "test", "bash: make html"]).await;
    assert!(text.starts_with("ask: rule 2 (tool = \"bash\", action = \"ask\")"), "{text}");
    let (ok, text) = cli(&app, &["approvals", "test", "bash: rm -rf build"]).await;
    assert!(ok, "{text}");
    assert_eq!(
        text.trim(),
        "deny: rule 1 (tool = \"bash\", match = \"rm *\", action = \"deny\")\n\
         untrusted runs: ask: rule 3 (untrusted: tool = \"*\", action = \"ask\")"
    );
    let (_, text) = cli(&app, &["approvals", "test", "read: /etc/hosts"]).await;
    assert_eq!(
        text.trim(),
        "allow: no rule matched\n\
         untrusted runs: allow: rule 1 (untrusted: tool = \"{read,list,grep,glob}\", action = \"allow\")"
    );
    let (ok, text) = cli(&app, &["approvals", "test", "no colon"]).await;
    assert!(!ok, "{text}");
    assert!(text.contains("write the call as `tool: subject`"), "{text}");

    let (_, text) = cli(&app, &["approvals"]).await;
    assert_eq!(text.trim(), "no call is waiting for an answer");
    let run_id = app.run_command("touch cli-file", "Done.").await;
    let request = until_asked(&app.gateway, &run_id).await;
    let id = request["id"].as_str().unwrap();
    let (_, text) = cli(&app, &["approvals"]).await;
    assert!(text.starts_with(id) && text.contains("bash: touch cli-file"), "{text}");
    let (ok, text) = cli(&app, &["approve", id]).await;
    assert!(ok, "{text}");
    assert_eq!(text.trim(), format!("{id}: approved (bash: touch cli-file)"));
    assert_eq!(app.gateway.wait(&run_id).await["answer"], "Done.");
    assert!(app.made("cli-file"));
    let (ok, text) = cli(&app, &["deny", id]).await;
    assert!(!ok, "a second answer fails: {text}");
    assert!(text.contains("already approved by api via api"), "{text}");
    app.gateway.terminate().await;
}

// ------------------------------------------------------------ Telegram

mod telegram {
    use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
    use lemon_tests::fake_telegram::{ChatSpec, FakeTelegram};
    use serde_json::{json, Value};

    use super::{KEY, RULES};
    use crate::support::{home_with, Gateway, PATIENCE};
    use crate::telegram_e2e::{config, fake_telegram, USER};

    struct Chat {
        fake: FakeTelegram,
        llm: FakeLlm,
        gateway: Gateway,
        _home: tempfile::TempDir,
    }

    /// A gateway whose Telegram chats run on the native engine under [`RULES`].
    async fn start() -> Chat {
        start_with("").await
    }

    /// [`start`], with `more` config (a binding) after the rules.
    async fn start_with(more: &str) -> Chat {
        let fake = fake_telegram().await;
        let llm = FakeLlm::builder().api_key(KEY).start().await;
        let extra = format!(
            "default_engine = \"lemon\"\n{RULES}{more}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
            llm.base_url()
        );
        let home = home_with(&config(&fake, "", &extra));
        std::fs::write(home.path().join("secrets.toml"), format!("openai_api_key = \"{KEY}\"\n"))
            .unwrap();
        let gateway = Gateway::start_in(home.path()).await;
        fake.wait_until("the bot's commands", PATIENCE, |s| s.commands().len() == 4).await;
        Chat { fake, llm, gateway, _home: home }
    }

    impl Chat {
        /// The user asks for something whose model runs `command`; the
        /// message with the buttons, once it is there.
        async fn ask(&self, command: &str) -> (i64, Value) {
            let call =
                FakeToolCall::new("call_tg", "bash", &[&json!({ "command": command }).to_string()]);
            self.llm.push(Turn::tool_calls(vec![call]));
            self.llm.push(Turn::text(&["All done."]));
            self.fake.inject_text(&ChatSpec::private(USER), USER, "please do it");
            let asked = |s: &lemon_tests::fake_telegram::Snapshot<'_>| {
                s.messages(USER).into_iter().find(|m| m.text.starts_with("Allow this?")).cloned()
            };
            self.fake
                .wait_until("the approval request in the chat", PATIENCE, |s| asked(s).is_some())
                .await;
            let message = self.fake.snapshot(asked).expect("asked");
            assert_eq!(message.text, format!("Allow this?\nbash: {command}"));
            let sent = self
                .fake
                .calls()
                .into_iter()
                .filter(|call| call.method == "sendMessage")
                .find(|call| {
                    call.params["text"].as_str().is_some_and(|t| t.starts_with("Allow this?"))
                })
                .expect("the sendMessage call");
            let keyboard = &sent.params["reply_markup"]["inline_keyboard"];
            assert_eq!(keyboard[1][0]["text"], "Always for this session", "{keyboard}");
            let always = keyboard[1][0]["callback_data"].as_str().unwrap_or_default();
            assert!(always.starts_with("apr:s:apr_"), "{keyboard}");
            (message.message_id, keyboard[0].clone())
        }

        /// What the bot answered the press of update `update_id`.
        async fn notice(&self, nth: usize) -> String {
            let answers = |s: &lemon_tests::fake_telegram::Snapshot<'_>| {
                s.calls_to("answerCallbackQuery")
                    .into_iter()
                    .map(|call| call.params["text"].as_str().unwrap_or_default().to_owned())
                    .collect::<Vec<_>>()
            };
            self.fake
                .wait_until("the press is answered", PATIENCE, |s| answers(s).len() > nth)
                .await;
            self.fake.snapshot(answers)[nth].clone()
        }

        fn tool_result(&self) -> String {
            super::tool_result(&self.llm)
        }

        async fn answered(&self) {
            self.fake
                .wait_until("the answer", PATIENCE, |s| {
                    s.messages(USER).iter().any(|m| m.text.contains("All done."))
                })
                .await;
        }
    }

    /// A bound chat's own rules come before the owner's: its `echo` runs
    /// unasked, and the run records the chat it came from.
    #[tokio::test]
    async fn a_bound_chats_rules_run_its_calls_unasked() {
        let binding = format!(
            "[[gateway.bindings]]\ntransport = \"telegram\"\nchat_id = {USER}\n\
             approvals = [{{ tool = \"bash\", match = \"echo *\", action = \"allow\" }}]\n"
        );
        let chat = start_with(&binding).await;
        let call = FakeToolCall::new(
            "call_tg",
            "bash",
            &[&json!({ "command": "echo bound-chat" }).to_string()],
        );
        chat.llm.push(Turn::tool_calls(vec![call]));
        chat.llm.push(Turn::text(&["All done."]));
        chat.fake.inject_text(&ChatSpec::private(USER), USER, "please do it");
        chat.answered().await;
        assert!(chat.tool_result().contains("bound-chat"), "{}", chat.tool_result());
        let asked = chat
            .fake
            .snapshot(|s| s.messages(USER).iter().any(|m| m.text.starts_with("Allow this?")));
        assert!(!asked, "the binding's rule allowed the call");
        let runs: Value = chat.gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
        let channel = &runs["runs"][0]["meta"]["channel"];
        assert_eq!(channel["transport"], "telegram", "{runs}");
        assert_eq!(channel["chat_id"], USER.to_string(), "{runs}");
        chat.gateway.terminate().await;
    }

    #[tokio::test]
    async fn a_button_in_the_chat_approves_and_a_second_press_is_told_it_was_settled() {
        let chat = start().await;
        let (message_id, buttons) = chat.ask("echo approved-in-chat").await;
        assert_eq!(buttons[0]["text"], "Approve");
        assert_eq!(buttons[1]["text"], "Deny");
        let approve = buttons[0]["callback_data"].as_str().unwrap().to_owned();
        assert!(approve.starts_with("apr:a:apr_"), "{approve}");
        chat.fake.press_button(&ChatSpec::private(USER), USER, message_id, &approve);
        assert_eq!(chat.notice(0).await, "Approved.");
        chat.answered().await;
        assert!(chat.tool_result().contains("approved-in-chat"), "{}", chat.tool_result());
        // The request's message says how it was settled, without buttons.
        let settled = |s: &lemon_tests::fake_telegram::Snapshot<'_>| {
            s.message(USER, message_id).map(|m| m.text.clone())
        };
        chat.fake
            .wait_until("the request's message is edited", PATIENCE, |s| {
                settled(s).is_some_and(|t| t.starts_with("Approved"))
            })
            .await;
        assert_eq!(
            chat.fake.snapshot(settled).unwrap(),
            "Approved (approved by @user1001 via telegram)\nbash: echo approved-in-chat"
        );
        chat.fake.press_button(&ChatSpec::private(USER), USER, message_id, &approve);
        let second = chat.notice(1).await;
        assert!(second.starts_with("Not taken: approval request apr_"), "{second}");
        assert!(second.ends_with("was already approved by @user1001 via telegram."), "{second}");
        chat.gateway.terminate().await;
    }

    #[tokio::test]
    async fn a_deny_button_keeps_the_command_from_running() {
        let chat = start().await;
        let (message_id, buttons) = chat.ask("echo never-in-chat").await;
        let deny = buttons[1]["callback_data"].as_str().unwrap().to_owned();
        chat.fake.press_button(&ChatSpec::private(USER), USER, message_id, &deny);
        assert_eq!(chat.notice(0).await, "Denied.");
        chat.answered().await;
        assert_eq!(
            chat.tool_result(),
            "The owner denied this call (@user1001 via telegram); it was not run."
        );
        chat.gateway.terminate().await;
    }
}

/// What a terminal shows, read as it comes.
struct Screen {
    stdout: tokio::process::ChildStdout,
    seen: String,
}

impl Screen {
    /// Reads until `done` holds of everything shown; all of it.
    async fn until(&mut self, what: &str, done: impl Fn(&str) -> bool) -> String {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        let read = async {
            while !done(&self.seen) {
                let n = self.stdout.read(&mut buf).await.unwrap();
                assert!(n > 0, "the terminal closed before {what}: {}", self.seen);
                self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        };
        if tokio::time::timeout(PATIENCE, read).await.is_err() {
            panic!("{what} never showed: {}", self.seen);
        }
        self.seen.clone()
    }
}

#[tokio::test]
async fn run_on_a_terminal_asks_inline_and_the_typed_answer_decides() {
    use tokio::io::AsyncWriteExt;
    let app = start("").await;
    let call = FakeToolCall::new(
        "call_1",
        "bash",
        &[&json!({ "command": "touch typed-yes" }).to_string()],
    );
    // The same command twice: `always` answers the first and covers the second.
    let again = FakeToolCall { id: "call_2".to_owned(), ..call.clone() };
    app.llm.push(Turn::tool_calls(vec![call]));
    app.llm.push(Turn::tool_calls(vec![again]));
    app.llm.push(Turn::text(&["Done on the terminal."]));
    let cwd = app.work.path().display().to_string();
    let mut command = crate::support::command_on_terminal(
        &app.gateway.home,
        &["run", "--cwd", &cwd, "make the file"],
    );
    command
        .env("LEMON_URL", &app.gateway.api)
        .env("TERM", "xterm")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("script runs");
    let mut stdin = child.stdin.take().unwrap();
    let mut screen = Screen { stdout: child.stdout.take().unwrap(), seen: String::new() };
    let question = "[y]es / [n]o / [a]lways for this session:";
    let asked = screen.until("the question", |s| s.contains(question)).await;
    assert!(asked.contains("Allow this? bash: touch typed-yes"), "{asked}");
    assert!(!app.made("typed-yes"), "nothing runs before the answer");
    // Not an answer: asked again.
    stdin.write_all(b"perhaps\n").await.unwrap();
    stdin.flush().await.unwrap();
    screen.until("the question again", |s| s.matches(question).count() >= 2).await;
    stdin.write_all(b"a\n").await.unwrap();
    stdin.flush().await.unwrap();
    let done = screen.until("the answer", |s| s.contains("Done on the terminal.")).await;
    assert!(done.contains("approved for this session by api via api"), "shown: {done}");
    assert_eq!(done.matches(question).count(), 2, "the second call was not asked: {done}");
    let results: Vec<String> = app
        .llm
        .requests()
        .iter()
        .filter_map(|r| {
            r.body["messages"].as_array()?.last()?["content"].as_str().map(str::to_owned)
        })
        .filter(|content| content.contains("[exit code"))
        .collect();
    assert_eq!(results.len(), 2, "both calls ran: {results:?}");
    let status = tokio::time::timeout(PATIENCE, child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}: {done}");
    assert!(app.made("typed-yes"));
    app.gateway.terminate().await;
}

/// The same through Discord: Approve / Deny buttons under a message in the
/// channel, pressed through `INTERACTION_CREATE`.
mod discord {
    use lemon_tests::fake_discord::{FakeDiscord, FakeMessage};
    use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
    use serde_json::json;

    use super::{KEY, RULES};
    use crate::discord_e2e::{config, fake, home, start_in, CHANNEL, STRANGER, USER};
    use crate::support::{Gateway, PATIENCE};

    struct Channel {
        fake: FakeDiscord,
        llm: FakeLlm,
        gateway: Gateway,
        _home: tempfile::TempDir,
    }

    /// A gateway whose Discord channels run on the native engine under [`RULES`].
    async fn start() -> Channel {
        let fake = fake().await;
        let llm = FakeLlm::builder().api_key(KEY).start().await;
        let extra = format!(
            "default_engine = \"lemon\"\n{RULES}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
            llm.base_url()
        );
        let home = home(&config(&fake, "", &extra));
        let secrets = home.path().join("secrets.toml");
        let text = std::fs::read_to_string(&secrets).unwrap();
        std::fs::write(&secrets, format!("{text}openai_api_key = \"{KEY}\"\n")).unwrap();
        let gateway = start_in(&fake, home.path()).await;
        Channel { fake, llm, gateway, _home: home }
    }

    impl Channel {
        /// The user asks for something whose model runs `command`; the
        /// message with the buttons, once it is there.
        async fn ask(&self, command: &str) -> FakeMessage {
            let call =
                FakeToolCall::new("call_dc", "bash", &[&json!({ "command": command }).to_string()]);
            self.llm.push(Turn::tool_calls(vec![call]));
            self.llm.push(Turn::text(&["All done."]));
            self.fake.inject_message(CHANNEL, USER, "please do it", true, None);
            let asked = |s: &lemon_tests::fake_discord::Snapshot<'_>| {
                s.bot_messages(CHANNEL)
                    .into_iter()
                    .find(|m| m.content.starts_with("Allow this?"))
                    .cloned()
            };
            self.fake
                .wait_until("the approval request in the channel", PATIENCE, |s| asked(s).is_some())
                .await;
            let message = self.fake.snapshot(asked).expect("asked");
            assert_eq!(message.content, format!("Allow this?\nbash: {command}"));
            message
        }

        /// What the bot answered interaction `id`.
        async fn notice(&self, id: u64) -> String {
            let reply = |s: &lemon_tests::fake_discord::Snapshot<'_>| {
                s.interaction_reply(id).map(str::to_owned)
            };
            self.fake.wait_until("the press is answered", PATIENCE, |s| reply(s).is_some()).await;
            self.fake.snapshot(reply).unwrap()
        }

        /// The request's message once it no longer starts with "Allow this?".
        async fn settled(&self, id: u64) -> FakeMessage {
            let settled = |s: &lemon_tests::fake_discord::Snapshot<'_>| {
                s.message(id).filter(|m| !m.content.starts_with("Allow this?")).cloned()
            };
            self.fake
                .wait_until("the request's message is edited", PATIENCE, |s| settled(s).is_some())
                .await;
            self.fake.snapshot(settled).unwrap()
        }

        async fn answered(&self) {
            self.fake
                .wait_until("the answer", PATIENCE, |s| {
                    s.bot_messages(CHANNEL).iter().any(|m| m.content.contains("All done."))
                })
                .await;
        }
    }

    #[tokio::test]
    async fn a_button_in_the_channel_approves_and_a_stranger_cannot() {
        let channel = start().await;
        let message = channel.ask("echo approved-in-discord").await;
        let ids = message.button_ids();
        assert_eq!(ids.len(), 3, "{:?}", message.components);
        assert_eq!(message.components[0]["components"][0]["label"], "Approve");
        assert_eq!(message.components[0]["components"][1]["label"], "Deny");
        assert_eq!(message.components[0]["components"][2]["label"], "Always for this session");
        assert!(ids[2].starts_with("apr:s:apr_"), "{ids:?}");
        assert!(ids[0].starts_with("apr:a:apr_"), "{ids:?}");

        // Someone not on the allow-list presses Approve: nothing is decided.
        let press = channel.fake.press_button(CHANNEL, message.id, STRANGER, &ids[0]);
        assert_eq!(channel.notice(press).await, "You may not answer here.");
        assert!(channel.llm.requests().len() == 1, "the call still waits");

        let press = channel.fake.press_button(CHANNEL, message.id, USER, &ids[0]);
        assert_eq!(channel.notice(press).await, "Approved.");
        channel.answered().await;
        assert!(
            super::tool_result(&channel.llm).contains("approved-in-discord"),
            "{}",
            super::tool_result(&channel.llm)
        );
        let settled = channel.settled(message.id).await;
        assert_eq!(
            settled.content,
            format!(
                "Approved (approved by @user{USER} via discord)\nbash: echo approved-in-discord"
            )
        );
        assert!(settled.button_ids().is_empty(), "the buttons are gone: {:?}", settled.components);

        let press = channel.fake.press_button(CHANNEL, message.id, USER, &ids[1]);
        let second = channel.notice(press).await;
        assert!(second.starts_with("Not taken: approval request apr_"), "{second}");
        assert!(second.ends_with(&format!("was already approved by @user{USER} via discord.")));
        channel.gateway.terminate().await;
    }

    #[tokio::test]
    async fn a_deny_button_keeps_the_command_from_running() {
        let channel = start().await;
        let message = channel.ask("echo never-in-discord").await;
        let deny = message.button_ids()[1].clone();
        let press = channel.fake.press_button(CHANNEL, message.id, USER, &deny);
        assert_eq!(channel.notice(press).await, "Denied.");
        channel.answered().await;
        assert_eq!(
            super::tool_result(&channel.llm),
            format!("The owner denied this call (@user{USER} via discord); it was not run.")
        );
        let settled = channel.settled(message.id).await;
        assert!(settled.content.starts_with("Not run (denied by @user"), "{}", settled.content);
        channel.gateway.terminate().await;
    }
}

/// The same by SMS, where there are no buttons: the request is texted with a
/// code, and a reply `yes <code>` from the conversation answers it.
mod sms {
    use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
    use lemon_tests::fake_twilio::FakeTwilio;
    use serde_json::json;

    use super::{KEY, RULES};
    use crate::sms_e2e::{
        deliver, inbound, sms_addr, sms_config, write_secrets, ACCOUNT_SID, AUTH_TOKEN, FRIEND,
    };
    use crate::support::{home_with, Gateway, PATIENCE};

    /// The bodies texted to [`FRIEND`] once there are `count`.
    async fn texts(twilio: &FakeTwilio, count: usize) -> Vec<String> {
        let created = twilio.wait_for_requests(count, PATIENCE).await;
        created.iter().filter_map(|r| r.field("Body")).map(str::to_owned).collect()
    }

    #[tokio::test]
    async fn a_reply_with_the_code_approves_and_a_second_reply_is_refused() {
        let twilio = FakeTwilio::start(ACCOUNT_SID, AUTH_TOKEN).await;
        let llm = FakeLlm::builder().api_key(KEY).start().await;
        let call = FakeToolCall::new(
            "call_sms",
            "bash",
            &[&json!({ "command": "echo approved-by-sms" }).to_string()],
        );
        llm.push(Turn::tool_calls(vec![call]));
        llm.push(Turn::text(&["All done."]));
        let config = format!(
            "[gateway]\ndefault_engine = \"lemon\"\n{RULES}{}[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
            sms_config(&twilio, "reply_to_allowed = true\n"),
            llm.base_url()
        );
        let home = home_with(&config);
        write_secrets(home.path(), &format!("openai_api_key = \"{KEY}\"\n"));
        let gateway = Gateway::start_in(home.path()).await;
        let addr = sms_addr(&gateway).await;

        deliver(&addr, &inbound("SM00000000000000000000000000000a01", FRIEND, "please do it"))
            .await;
        let asked = texts(&twilio, 1).await;
        let (question, code) = asked[0].rsplit_once("\nReply yes ").expect("a code to reply with");
        let code = code.split(' ').next().unwrap().to_owned();
        assert_eq!(question, "Allow this?\nbash: echo approved-by-sms");
        assert_eq!(
            asked[0],
            format!(
                "{question}\nReply yes {code} or no {code} \
                 (always {code}: yes for the rest of this conversation)."
            )
        );

        // A code no request of this conversation has is refused; nothing runs.
        deliver(&addr, &inbound("SM00000000000000000000000000000a02", FRIEND, "yes 0000")).await;
        assert_eq!(texts(&twilio, 2).await[1], "Not taken: no approval request 0000.");
        assert_eq!(llm.requests().len(), 1, "the call still waits");

        let reply = format!("YES {code}");
        deliver(&addr, &inbound("SM00000000000000000000000000000a03", FRIEND, &reply)).await;
        // The notice and the run's answer, in either order.
        let mut last = texts(&twilio, 4).await[2..].to_vec();
        last.sort();
        assert_eq!(last, ["All done.", "Approved."]);
        assert!(super::tool_result(&llm).contains("approved-by-sms"));

        let again = format!("no {code}");
        deliver(&addr, &inbound("SM00000000000000000000000000000a04", FRIEND, &again)).await;
        assert_eq!(texts(&twilio, 5).await[4], format!("Not taken: no approval request {code}."));
        let runs: serde_json::Value =
            gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
        assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "the replies started no run");
        gateway.terminate().await;
    }
}
