//! No option injection into vendor CLIs, end to end on the real binary: every
//! vendor's CLI is the fake, which records the argv it was started with. A resume
//! token, a composite engine id's model, a directive's model, a resume line in the
//! prompt and `meta.model` that could be read as an option are refused (400 from
//! the control API and a webhook, a short reply in Telegram) and start no process;
//! accepted values reach the command line only in a form no CLI reads as an option.

use std::path::{Path, PathBuf};

use lemon_core::store::StoreHandle;
use lemon_engines::cli::Vendor;
use lemon_tests::fake_cli::fixture;
use lemon_tests::fake_telegram::ChatSpec;
use serde_json::{json, Value};

use crate::cli_support::{read_args, success_fixture};
use crate::support::{home_with, Gateway, PATIENCE};
use crate::telegram_e2e::{config as telegram_config, fake_telegram, start, wait_for_reply, USER};

const SKIP: &str = "--dangerously-skip-permissions";
const HOOK_TOKEN: &str = "hook-injection-token-5c2e";

/// `[gateway.engines.<vendor>]` for every vendor: the fake CLI replaying a
/// successful run and recording its argv in `<dir>/<vendor>.args`.
fn engines_config(dir: &Path) -> String {
    Vendor::ALL
        .into_iter()
        .map(|vendor| {
            format!(
                "[gateway.engines.{id}]\ncli_path = \"{cli}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{fixture}\", FAKE_CLI_ARGS_FILE = \"{args}\" }}\n",
                id = vendor.id(),
                cli = env!("CARGO_BIN_EXE_fake-cli"),
                fixture = fixture(vendor.id(), success_fixture(vendor)).display(),
                args = args_file(dir, vendor).display(),
            )
        })
        .chain([crate::support::ALLOW_EVERY_CALL.to_owned()])
        .collect()
}

fn args_file(dir: &Path, vendor: Vendor) -> PathBuf {
    dir.join(format!("{}.args", vendor.id()))
}

/// A token of `vendor`'s own shape.
fn valid_token(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Opencode => "ses_7c1e2f3a4b5cXyZ",
        _ => "5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a",
    }
}

/// `vendor`'s resume line with `token` as written.
fn resume_line(vendor: Vendor, token: &str) -> String {
    match vendor {
        Vendor::Claude => format!("claude --resume {token}"),
        Vendor::Codex => format!("codex resume {token}"),
        Vendor::Opencode => format!("opencode --session {token}"),
        Vendor::Pi => format!("pi --session {token}"),
        Vendor::Droid => format!("droid exec -s {token}"),
    }
}

/// Posts a run and expects 400 with an error naming `field`.
async fn refused(gateway: &Gateway, body: Value, field: &str) {
    let response = gateway.post("/v1/runs").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 400, "{body}");
    let answer: Value = response.json().await.unwrap();
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(error.starts_with(&format!("{field}: invalid ")), "{body} -> {answer}");
    for injected in [SKIP, "--allowedTools", "--yolo"] {
        assert!(!error.contains(injected), "the value is not repeated: {error}");
    }
}

#[tokio::test]
async fn the_api_refuses_injected_tokens_and_models_for_every_vendor_and_starts_no_cli() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&engines_config(dir.path())).await;
    for vendor in Vendor::ALL {
        let id = vendor.id();
        refused(
            &gateway,
            json!({ "prompt": "hi", "resume": { "engine": id, "value": SKIP } }),
            "resume.value",
        )
        .await;
        refused(
            &gateway,
            json!({ "prompt": "hi", "resume": { "engine": format!("{id}:{SKIP}"), "value": valid_token(vendor) } }),
            "resume.engine",
        )
        .await;
        refused(&gateway, json!({ "prompt": "hi", "engine": format!("{id}:{SKIP}") }), "engine")
            .await;
        refused(&gateway, json!({ "prompt": format!("/{id}:--allowedTools=Bash hi") }), "prompt")
            .await;
        refused(
            &gateway,
            json!({ "prompt": "hi", "engine": id, "meta": { "model": "--yolo" } }),
            "meta.model",
        )
        .await;
        if vendor != Vendor::Opencode {
            // OpenCode's line only takes `ses_…`, so no option can be read from it.
            refused(&gateway, json!({ "prompt": resume_line(vendor, "--yolo") }), "prompt").await;
        }
    }
    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    assert_eq!(runs["runs"], json!([]), "nothing was queued");
    for vendor in Vendor::ALL {
        assert!(!args_file(dir.path(), vendor).exists(), "{vendor} was started");
    }
}

#[tokio::test]
async fn accepted_values_reach_every_cli_only_where_its_option_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&engines_config(dir.path())).await;
    for vendor in Vendor::ALL {
        let token = valid_token(vendor);
        let run_id = gateway
            .submit(json!({
                "prompt": format!("{}\n--yolo is text", resume_line(vendor, token)),
                "meta": { "model": "opus" },
                "session_key": vendor.id(),
            }))
            .await;
        let record = gateway.wait(&run_id).await;
        assert_eq!(record["status"], "completed", "{vendor}: {record}");
        let argv = read_args(&args_file(dir.path(), vendor)).argv;
        let has = |expected: &[&str]| argv.windows(expected.len()).any(|w| w == expected);
        match vendor {
            Vendor::Claude => {
                assert!(has(&["--model=opus"]) && has(&[&format!("--resume={token}")]), "{argv:?}");
            }
            Vendor::Codex => {
                assert!(has(&["--model=opus"]) && has(&["resume", "--", token, "-"]), "{argv:?}");
            }
            Vendor::Opencode => {
                assert!(has(&[&format!("--session={token}"), "--model=opus"]), "{argv:?}");
                assert!(argv.ends_with(&["--".to_owned(), "--yolo is text".to_owned()]));
            }
            Vendor::Pi => {
                assert!(
                    has(&["--model", "opus", "--session", token, " --yolo is text"]),
                    "{argv:?}"
                );
            }
            Vendor::Droid => {
                assert!(has(&["-s", token, "-m", "opus"]), "{argv:?}");
                assert_eq!(argv.last().map(String::as_str), Some(" --yolo is text"), "{argv:?}");
            }
        }
        // Up to `--` (after which everything is positional), no injected option.
        let options = argv.split(|a| a == "--").next().unwrap_or_default();
        assert!(
            !options.iter().any(|a| a.starts_with("--yolo") || a.starts_with("--dangerously")),
            "{vendor}: {argv:?}"
        );
    }
}

#[tokio::test]
async fn a_composite_engine_id_puts_its_model_in_the_option_form() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&engines_config(dir.path())).await;
    let run_id = gateway
        .submit(json!({ "prompt": "-p is text", "engine": "claude:claude-opus-4-1@20250805" }))
        .await;
    assert_eq!(gateway.wait(&run_id).await["status"], "completed");
    let recorded = read_args(&args_file(dir.path(), Vendor::Claude));
    assert!(recorded.argv.contains(&"--model=claude-opus-4-1@20250805".to_owned()), "{recorded:?}");
    assert!(!recorded.argv.iter().any(|a| a.starts_with("--resume")), "{recorded:?}");
    assert_eq!(recorded.stdin, "-p is text\n", "the prompt goes on stdin");
}

#[tokio::test]
async fn a_webhook_with_its_token_gets_400_for_injected_values_and_starts_no_cli() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[gateway]\nenable_webhook = true\n{}\
         [gateway.webhook]\nport = 0\n\
         [gateway.webhook.integrations.ci]\ntoken = \"{HOOK_TOKEN}\"\n",
        engines_config(dir.path())
    );
    let gateway = Gateway::start(&config).await;
    let url = gateway.webhook_url("ci");
    let cases = [
        (json!({ "prompt": "hi", "engine": format!("claude:{SKIP}") }), "engine"),
        (json!({ "prompt": "codex resume --dangerously-bypass-approvals-and-sandbox" }), "prompt"),
        (json!({ "prompt": "/droid:--auto=high go" }), "prompt"),
        (json!({ "text": "pi --session --yolo" }), "prompt"),
    ];
    for (body, field) in cases {
        let response = gateway
            .http
            .post(&url)
            .bearer_auth(HOOK_TOKEN)
            .json(&body)
            .timeout(PATIENCE)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let answer: Value = response.json().await.unwrap();
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.starts_with(&format!("{field}: invalid ")), "{body} -> {answer}");
    }
    for vendor in Vendor::ALL {
        assert!(!args_file(dir.path(), vendor).exists(), "{vendor} was started");
    }
}

#[tokio::test]
async fn a_telegram_message_with_an_injected_value_gets_a_short_reply_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake_telegram().await;
    let _gateway = start(&fake, &telegram_config(&fake, "", &engines_config(dir.path()))).await;
    let chat = ChatSpec::private(USER);
    let cases = [
        (format!("claude --resume {SKIP}"), "Invalid resume token for claude."),
        (
            "codex resume --dangerously-bypass-approvals-and-sandbox".to_owned(),
            "Invalid resume token for codex.",
        ),
        ("/claude:--allowedTools=Bash hi".to_owned(), "Invalid model for claude."),
        ("/engine opencode:--yolo".to_owned(), "Invalid model for opencode."),
    ];
    for (text, reply) in cases {
        let message = fake.inject_text(&chat, USER, &text);
        let answer = wait_for_reply(&fake, USER, message.message_id, reply).await;
        assert_eq!(answer.text, reply);
    }
    for vendor in Vendor::ALL {
        assert!(!args_file(dir.path(), vendor).exists(), "{vendor} was started");
    }
}

#[tokio::test]
async fn a_stored_session_token_that_could_be_an_option_is_ignored_and_a_new_session_starts() {
    let dir = tempfile::tempdir().unwrap();
    let home = home_with(&engines_config(dir.path()));
    let store = StoreHandle::open_sqlite(&home.path().join("lemon.db")).unwrap();
    store.put_chat_state(&"poisoned".into(), "claude", SKIP, lemon_core::clock::now_ms()).await;
    store.close().await.unwrap();
    drop(store);

    let gateway = Gateway::start_in(home.path()).await;
    let run_id = gateway
        .submit(json!({ "prompt": "hi", "session_key": "poisoned", "engine": "claude" }))
        .await;
    let record = gateway.wait(&run_id).await;
    assert_eq!(record["status"], "completed", "{record}");
    assert!(record["meta"].get("resume_source").is_none(), "a new session: {record}");
    let argv = read_args(&args_file(dir.path(), Vendor::Claude)).argv;
    assert!(!argv.iter().any(|a| a.starts_with("--resume") || a.contains(SKIP)), "{argv:?}");
    // The run's own session replaced the stored one: the next message continues it.
    let next = gateway
        .submit(json!({ "prompt": "again", "session_key": "poisoned", "engine": "claude" }))
        .await;
    assert_eq!(gateway.wait(&next).await["meta"]["resume_source"], "auto");
    let argv = read_args(&args_file(dir.path(), Vendor::Claude)).argv;
    assert_eq!(
        argv.last().map(String::as_str),
        Some("--resume=5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a")
    );
}

#[tokio::test]
async fn a_config_model_that_could_be_an_option_stops_the_gateway_naming_file_line_and_column() {
    let home = home_with(&format!("[gateway]\ndefault_engine = \"claude:{SKIP}\"\n"));
    let (code, stderr) = crate::support::failed_start(home.path()).await;
    assert_eq!(code, Some(5));
    let expected = format!(
        "{}:2:18: gateway.default_engine: invalid model: it starts with '-'",
        home.path().join("config.toml").display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}
