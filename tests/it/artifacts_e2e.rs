//! What a run's end hands to its channel, on the real binary with the fake CLI:
//! a file named by a `MEDIA:` line goes to a Telegram chat as a photo and to a
//! webhook as an attachment, without the line in the text; a path outside the
//! run's directory is not sent; at most 4 images the run created go with one
//! answer; a failed command's `result_meta` is on the event stream.

use base64::Engine as _;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use lemon_tests::fake_telegram::ChatSpec;

use crate::support::{Gateway, PATIENCE};
use crate::telegram_e2e::{config, fake_telegram, start, wait_for_reply, USER};
use crate::webhook_e2e::receive_one;

const CHART: &str = "not really a png";

fn fixture(vendor: &str, name: &str) -> String {
    format!("{}/fixtures/cli/{vendor}/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `[gateway.engines.codex]` replaying the MEDIA fixture, writing `chart.png`
/// in the run's directory first.
fn codex_writing_a_chart() -> String {
    format!(
        "[gateway.engines.codex]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\", FAKE_CLI_WRITE_FILE = \"chart.png={CHART}\" }}\n{}",
        env!("CARGO_BIN_EXE_fake-cli"),
        fixture("codex", "synth_media_answer.jsonl"),
        crate::support::TRUST_EVERY_CALL,
    )
}

#[tokio::test]
async fn a_telegram_chat_gets_the_photo_and_the_text_without_the_media_line() {
    let fake = fake_telegram().await;
    let cwd = tempfile::tempdir().unwrap();
    let extra = format!("default_cwd = \"{}\"\n{}", cwd.path().display(), codex_writing_a_chart());
    let gateway = start(&fake, &config(&fake, "engine = \"codex\"", &extra)).await;
    let chat = ChatSpec::private(USER);
    let asked = fake.inject_text(&chat, USER, "plot it");
    let answer = wait_for_reply(&fake, USER, asked.message_id, "Here is the chart.").await;
    assert!(!answer.text.contains("MEDIA"), "{:?}", answer.text);
    fake.wait_until("the chart as a photo", PATIENCE, |s| !s.files(USER).is_empty()).await;
    let files = fake.files(USER);
    assert_eq!(files.len(), 1, "only the file inside the run's directory: {files:?}");
    assert_eq!(files[0].method, "sendPhoto");
    assert_eq!(files[0].filename, "chart.png");
    assert_eq!(files[0].content_type, "image/png");
    assert_eq!(files[0].content, CHART.as_bytes());
    assert!(files[0].message_id > answer.message_id, "the file follows the answer");

    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    let run_id = runs["runs"][0]["run_id"].as_str().unwrap();
    let record = gateway.run(run_id).await;
    let artifacts = record["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 1, "{record}");
    assert_eq!(artifacts[0]["filename"], "chart.png");
    assert_eq!(artifacts[0]["size"], CHART.len());
    assert_eq!(artifacts[0]["mime"], "image/png");
    assert!(!record["answer"].as_str().unwrap().contains("MEDIA"), "{record}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_webhook_answer_and_callback_carry_the_file_and_leave_out_the_outside_path() {
    let callback = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback_url = format!("http://{}/done", callback.local_addr().unwrap());
    let cwd = tempfile::tempdir().unwrap();
    let config = format!(
        "[gateway]\nenable_webhook = true\ndefault_engine = \"codex\"\ndefault_cwd = \"{}\"\n\
         {}\
         [gateway.webhook]\nport = 0\nallow_private_callback_hosts = true\n\
         [gateway.webhook.integrations.ci]\ntoken = \"hook-token-artifacts\"\nmode = \"sync\"\ncallback_url = \"{callback_url}\"\n",
        cwd.path().display(),
        codex_writing_a_chart(),
    );
    let gateway = Gateway::start(&config).await;
    let response =
        gateway.post_webhook("ci", "hook-token-artifacts", &json!({ "prompt": "plot it" })).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let expected = json!([{
        "filename": "chart.png",
        "caption": null,
        "size": CHART.len(),
        "mime": "image/png",
        "content_base64": base64::engine::general_purpose::STANDARD.encode(CHART),
    }]);
    assert_eq!(body["answer"], "Here is the chart.", "{body}");
    assert_eq!(body["attachments"], expected, "{body}");
    assert!(body.get("artifacts").is_none(), "no local paths in a webhook answer: {body}");
    let delivered =
        tokio::time::timeout(PATIENCE, receive_one(callback)).await.expect("callback in time");
    assert_eq!(delivered["completed"]["attachments"], expected, "{delivered}");
    assert_eq!(delivered["completed"]["answer"], "Here is the chart.");
    gateway.terminate().await;
}

/// The documented cap: with `auto_send_generated_images`, at most 4 images a
/// run created go with its answer, beside the files it names itself (here one
/// `MEDIA:` line, so the cap is the only limit reached).
#[tokio::test]
async fn at_most_4_generated_images_go_with_an_answer() {
    let cwd = tempfile::tempdir().unwrap();
    let images: Vec<String> = (1..=6).map(|n| format!("drawing{n}.png")).collect();
    for image in &images {
        std::fs::write(cwd.path().join(image), format!("image {image}")).unwrap();
    }
    std::fs::write(cwd.path().join("notes.txt"), "notes").unwrap();
    let changes: Vec<Value> =
        images.iter().map(|image| json!({ "path": image, "kind": "add" })).collect();
    let replay = [
        json!({ "type": "thread.started", "thread_id": "drawing-thread" }),
        json!({ "type": "item.completed", "item": { "type": "file_change", "id": "fc_1", "changes": changes, "status": "completed" } }),
        json!({ "type": "item.completed", "item": { "type": "agent_message", "id": "2", "text": "Six drawings.\nMEDIA: notes.txt" } }),
        json!({ "type": "turn.completed" }),
    ];
    let fixture = cwd.path().join("replay.jsonl");
    let lines: Vec<String> = replay.iter().map(Value::to_string).collect();
    std::fs::write(&fixture, lines.join("\n") + "\n").unwrap();
    let config = format!(
        "[gateway]\nenable_webhook = true\ndefault_engine = \"codex\"\ndefault_cwd = \"{}\"\n\
         auto_send_generated_images = true\n\
         [gateway.engines.codex]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\" }}\n{}\
         [gateway.webhook]\nport = 0\n\
         [gateway.webhook.integrations.ci]\ntoken = \"hook-token-drawings\"\nmode = \"sync\"\n",
        cwd.path().display(),
        env!("CARGO_BIN_EXE_fake-cli"),
        fixture.display(),
        crate::support::TRUST_EVERY_CALL,
    );
    let gateway = Gateway::start(&config).await;
    let response =
        gateway.post_webhook("ci", "hook-token-drawings", &json!({ "prompt": "draw" })).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["answer"], "Six drawings.", "{body}");
    let sent: Vec<&str> = body["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|file| file["filename"].as_str().unwrap())
        .collect();
    assert_eq!(
        sent,
        ["notes.txt", "drawing1.png", "drawing2.png", "drawing3.png", "drawing4.png"],
        "{body}"
    );
    let record = gateway.run(body["run_id"].as_str().unwrap()).await;
    assert_eq!(record["artifacts"].as_array().unwrap().len(), 5, "{record}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_failed_commands_result_meta_is_on_the_event_stream() {
    let cwd = tempfile::tempdir().unwrap();
    let config = format!(
        "[gateway]\ndefault_engine = \"codex\"\ndefault_cwd = \"{}\"\n\
         [gateway.engines.codex]\ncli_path = \"{}\"\nenv = {{ FAKE_CLI_FIXTURE = \"{}\" }}\n{}",
        cwd.path().display(),
        env!("CARGO_BIN_EXE_fake-cli"),
        fixture("codex", "synth_all_item_types.jsonl"),
        crate::support::ALLOW_EVERY_CALL,
    );
    let gateway = Gateway::start(&config).await;
    let run_id = gateway.submit(json!({ "prompt": "run the tests" })).await;
    for _ in 0..2 {
        // Once as the run streams (or from the store), once again from the store.
        let events = gateway.events(&run_id).await;
        let failed: Vec<&Value> = events
            .iter()
            .filter(|(kind, _)| kind == "engine_action")
            .map(|(_, data)| &data["action"])
            .filter(|action| action["id"] == "item_6" && action["phase"] == "completed")
            .collect();
        assert_eq!(failed.len(), 1, "{events:?}");
        assert_eq!(failed[0]["ok"], false);
        assert_eq!(
            failed[0]["result_meta"],
            json!({ "error_type": "nonzero_exit", "exit_code": 1 }),
            "{}",
            failed[0]
        );
        let ok: Vec<&Value> = events
            .iter()
            .filter_map(|(_, data)| data.get("action"))
            .filter(|action| action["id"] == "item_1" && action["phase"] == "completed")
            .collect();
        assert_eq!(ok[0]["result_meta"], Value::Null);
    }
    gateway.terminate().await;
}
