//! Photos, files and voice notes sent to the Telegram bot, end to end: the
//! real gateway binary polling the fake Bot API (its `getFile` and file
//! download route serve what the test sends), the echo engine (it answers
//! with its prompt, so the answer shows the note naming the saved files),
//! the native engine against the fake LLM (to see the image it is given),
//! and the fake transcription service.

use std::path::Path;

use lemon_tests::fake_llm::{FakeLlm, Turn};
use lemon_tests::fake_telegram::{ChatSpec, FakeTelegram, UserFile};
use lemon_tests::fake_transcribe::{speech_ogg, Api, FakeTranscribe};

use crate::support::{home_with, Gateway, ALLOW_EVERY_CALL, PATIENCE};
use crate::telegram_e2e::{config, fake_telegram, wait_for_reply, BOT_TOKEN, USER};

/// A PNG's first bytes, enough to be taken for one.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01 a chart of the q3 numbers";
const PNG_2: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x02\0\0\0\x02 the stack trace";
const PDF: &[u8] = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n";
const LLM_KEY: &str = "sk-test-telegram-media-key";
const TRANSCRIBE_KEY: &str = "sk-transcribe-telegram-7c2e";

/// The echo engine working in `project`, as `[gateway]` lines.
fn echo_in(project: &Path) -> String {
    format!("default_engine = \"echo\"\ndefault_cwd = \"{}\"\n", project.display())
}

/// Starts the gateway on `home` and waits until the bot polls.
async fn start_in(fake: &FakeTelegram, home: &Path) -> Gateway {
    let gateway = Gateway::start_in(home).await;
    fake.wait_until("the bot's commands", PATIENCE, |s| s.commands().len() == 4).await;
    gateway
}

async fn start(fake: &FakeTelegram, config: &str) -> (tempfile::TempDir, Gateway) {
    let home = home_with(config);
    let gateway = start_in(fake, home.path()).await;
    (home, gateway)
}

fn uploads(project: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(project.join(".lemon/uploads"))
        .map(|dir| dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

async fn runs(gateway: &Gateway) -> usize {
    let runs: serde_json::Value =
        gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    runs["runs"].as_array().map_or(0, Vec::len)
}

/// No call, reply or log the test can see carries the bot token.
fn assert_token_kept(fake: &FakeTelegram) {
    let calls = fake.describe_calls();
    assert!(!calls.contains(BOT_TOKEN), "the token shows in the calls");
    for message in fake.messages(USER) {
        assert!(!message.text.contains(BOT_TOKEN), "the token in a reply: {}", message.text);
    }
}

#[tokio::test]
async fn a_telegram_photo_reaches_the_model_as_an_image_with_its_exact_bytes() {
    let fake = fake_telegram().await;
    let llm = FakeLlm::builder().api_key(LLM_KEY).start().await;
    llm.push(Turn::text(&["It is a chart."]));
    let project = tempfile::tempdir().unwrap();
    let lemon = format!(
        "{ALLOW_EVERY_CALL}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n",
        llm.base_url()
    );
    let cwd = format!("default_cwd = \"{}\"\n", project.path().display());
    let home = home_with(&format!("{}{lemon}", config(&fake, "engine = \"lemon\"", &cwd)));
    let secrets = home.path().join("secrets.toml");
    std::fs::write(&secrets, format!("openai_api_key = \"{LLM_KEY}\"\n")).unwrap();
    std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    let _gateway = start_in(&fake, home.path()).await;

    let chat = ChatSpec::private(USER);
    let sent = fake.inject_photo_bytes(&chat, USER, Some("what does this show?"), PNG);
    wait_for_reply(&fake, USER, sent.message_id, "It is a chart.").await;

    let request = llm.requests().last().cloned().expect("the model was asked");
    let images = request.images();
    assert_eq!(images.len(), 1, "one image block: {images:?}");
    assert_eq!(images[0].mime, "image/png");
    assert_eq!(images[0].bytes, PNG, "the photo's largest size, byte for byte");
    let text = request.last_message_text();
    assert!(text.contains("what does this show?"), "the caption is the prompt: {text}");
    assert!(text.contains(".lemon/uploads/photo-"), "the saved photo is named: {text}");
    assert_eq!(fake.downloads().len(), 1, "only the largest size was fetched");
    assert_token_kept(&fake);
}

#[tokio::test]
async fn a_pdf_lands_in_the_uploads_directory_and_the_prompt_names_it() {
    let fake = fake_telegram().await;
    let project = tempfile::tempdir().unwrap();
    let (_home, _gateway) = start(&fake, &config(&fake, "", &echo_in(project.path()))).await;

    let chat = ChatSpec::private(USER);
    let report = UserFile::new("q3 report.pdf", "application/pdf", PDF);
    let sent = fake.inject_document(&chat, USER, Some("summarise this"), &report);
    let answer = wait_for_reply(&fake, USER, sent.message_id, "q3 report.pdf").await;
    assert!(answer.text.starts_with("summarise this"), "{}", answer.text);
    assert!(
        answer.text.contains(".lemon/uploads/q3 report.pdf (file, application/pdf"),
        "{}",
        answer.text
    );
    let saved = project.path().join(".lemon/uploads/q3 report.pdf");
    assert_eq!(std::fs::read(saved).unwrap(), PDF);

    // Without a caption the run gets a default prompt.
    let again = fake.inject_document(&chat, USER, None, &report);
    let answer = wait_for_reply(&fake, USER, again.message_id, "q3 report-1.pdf").await;
    assert!(answer.text.starts_with("(files attached)"), "{}", answer.text);
    assert_token_kept(&fake);
}

#[tokio::test]
async fn hostile_names_and_oversized_files_are_refused_with_a_reply_and_nothing_runs() {
    let fake = fake_telegram().await;
    let project = tempfile::tempdir().unwrap();
    let files = "\n[gateway.telegram.files]\nmax_download_bytes = 1024\n";
    let (_home, gateway) = start(&fake, &config(&fake, files, &echo_in(project.path()))).await;
    let chat = ChatSpec::private(USER);

    let hostile = UserFile::new("../../.bashrc", "text/plain", b"rm -rf ~");
    let sent = fake.inject_document(&chat, USER, Some("keep this"), &hostile);
    let reply = wait_for_reply(&fake, USER, sent.message_id, ".bashrc").await;
    assert_eq!(reply.text, "the file name \"../../.bashrc\" is refused: it holds a directory");

    let big = UserFile::new("big.log", "text/plain", &[b'x'; 5000]);
    let sent = fake.inject_document(&chat, USER, None, &big);
    let reply = wait_for_reply(&fake, USER, sent.message_id, "big.log").await;
    assert_eq!(reply.text, "big.log is 5 KB — the limit is 1 KB");

    // Announced small, larger when it comes: the download stops at the limit.
    let liar = UserFile::new("liar.log", "text/plain", &[b'y'; 300_000]).announcing(10);
    let sent = fake.inject_document(&chat, USER, None, &liar);
    let reply = wait_for_reply(&fake, USER, sent.message_id, "liar.log is").await;
    assert!(reply.text.ends_with("— the limit is 1 KB"), "{}", reply.text);

    // A photo all of whose sizes are over the limit.
    let photo = [PNG, &[b'p'; 10_000][..]].concat();
    let sent = fake.inject_photo_bytes(&chat, USER, None, &photo);
    let reply = wait_for_reply(&fake, USER, sent.message_id, "the limit is 1 KB").await;
    assert!(reply.text.starts_with("photo-"), "{}", reply.text);

    let downloads = fake.downloads();
    assert_eq!(downloads.len(), 1, "only the liar was fetched: {downloads:?}");
    assert_eq!(runs(&gateway).await, 0, "no run started");
    assert!(uploads(project.path()).is_empty(), "nothing saved: {:?}", uploads(project.path()));
    assert!(!project.path().join(".bashrc").exists());
    assert_token_kept(&fake);
}

#[tokio::test]
async fn a_spoken_voice_note_is_transcribed_and_its_words_are_the_prompt() {
    let ogg = speech_ogg("deploy the staging branch");
    let transcribe = FakeTranscribe::start(TRANSCRIBE_KEY, "deploy the staging branch").await;
    let fake = fake_telegram().await;
    let project = tempfile::tempdir().unwrap();
    let voice = format!(
        "voice_transcription = true\nvoice_transcription_base_url = \"{}\"\n\
         voice_transcription_model = \"whisper-1\"\nvoice_transcription_api_key = \"{TRANSCRIBE_KEY}\"\n\
         show_transcript = true\n",
        transcribe.openai_base_url()
    );
    let (_home, gateway) = start(&fake, &config(&fake, &voice, &echo_in(project.path()))).await;
    let chat = ChatSpec::private(USER);

    let sent = fake.inject_voice(&chat, USER, &ogg, 2, None);
    let heard = wait_for_reply(&fake, USER, sent.message_id, "heard:").await;
    assert_eq!(heard.text, "heard: deploy the staging branch");
    let answer =
        wait_for_reply(&fake, USER, sent.message_id, "(voice transcribed) deploy the staging")
            .await;
    assert!(heard.message_id < answer.message_id, "the transcript comes first");
    let uploads = transcribe.wait_for_uploads(1).await;
    assert_eq!(uploads[0].api, Api::OpenAi);
    assert_eq!(uploads[0].audio, ogg, "the exact OGG bytes were transcribed");
    assert_eq!(uploads[0].model, "whisper-1");
    assert_eq!(uploads[0].auth, format!("Bearer {TRANSCRIBE_KEY}"));

    // Over voice_max_bytes (10 MiB by default) by what Telegram announces:
    // refused before it is fetched or uploaded.
    let downloads = fake.downloads().len();
    let sent = fake.inject_voice(&chat, USER, &ogg, 2, Some(11 * 1024 * 1024));
    let reply = wait_for_reply(&fake, USER, sent.message_id, "the voice message").await;
    assert_eq!(reply.text, "the voice message is 11.0 MB — the limit for transcription is 10.0 MB");
    assert_eq!(fake.downloads().len(), downloads, "not fetched");
    assert_eq!(transcribe.uploads().len(), 1, "not uploaded");
    assert_eq!(runs(&gateway).await, 1, "only the first note ran");
    assert_token_kept(&fake);
}

#[tokio::test]
async fn file_put_and_file_get_stay_inside_the_project() {
    let fake = fake_telegram().await;
    // A folder of its own around the project, so nothing is at `../x` before.
    let around = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir_in(around.path()).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "not yours").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), project.path().join("link"))
        .unwrap();
    std::fs::write(project.path().join(".env"), "TOKEN=abc").unwrap();
    let (_home, gateway) = start(&fake, &config(&fake, "", &echo_in(project.path()))).await;
    let chat = ChatSpec::private(USER);
    let notes = UserFile::new("notes.txt", "text/plain", b"remember the lemons\n");

    let put = fake.inject_document(&chat, USER, Some("/file put docs/"), &notes);
    let reply = wait_for_reply(&fake, USER, put.message_id, "Saved").await;
    assert_eq!(reply.text, "Saved docs/notes.txt");
    let saved = std::fs::read(project.path().join("docs/notes.txt")).unwrap();
    assert_eq!(saved, b"remember the lemons\n");

    let again = fake.inject_document(&chat, USER, Some("/file put docs/"), &notes);
    let reply = wait_for_reply(&fake, USER, again.message_id, "exists").await;
    assert!(reply.text.contains("/file put --force docs/notes.txt"), "{}", reply.text);

    let escape = fake.inject_document(&chat, USER, Some("/file put ../x"), &notes);
    let reply = wait_for_reply(&fake, USER, escape.message_id, "outside").await;
    assert_eq!(reply.text, "../x is outside the project");
    assert!(!around.path().join("x").exists());

    let cases = [
        ("/file get ../../etc/passwd", "../../etc/passwd is outside the project"),
        ("/file get link", "link is outside the project"),
        ("/file get .env", ".env is refused (it matches \".env\" in deny_globs)"),
        ("/file get nothing-here.txt", "nothing-here.txt does not exist in the project"),
        ("/file", lemon_core::media::FILE_USAGE),
    ];
    for (command, expected) in cases {
        let asked = fake.inject_text(&chat, USER, command);
        let needle = expected.split_whitespace().last().unwrap();
        let reply = wait_for_reply(&fake, USER, asked.message_id, needle).await;
        assert_eq!(reply.text, expected, "{command}");
    }

    let get = fake.inject_text(&chat, USER, "/file get docs/notes.txt");
    fake.wait_until("the document sent back", PATIENCE, |s| !s.files(USER).is_empty()).await;
    let files = fake.files(USER);
    assert_eq!(files.len(), 1, "only the one asked for: {files:?}");
    assert_eq!(files[0].method, "sendDocument");
    assert_eq!(files[0].filename, "notes.txt");
    assert_eq!(files[0].content, b"remember the lemons\n");
    assert_eq!(files[0].caption.as_deref(), Some("docs/notes.txt"));
    assert!(fake.replies_to(USER, get.message_id).is_empty(), "the file is the answer");
    assert_eq!(runs(&gateway).await, 0, "/file starts no run");
    assert_token_kept(&fake);
}

#[tokio::test]
async fn an_album_of_two_photos_is_one_run_with_both_files() {
    let fake = fake_telegram().await;
    let project = tempfile::tempdir().unwrap();
    let files = "\n[gateway.telegram.files]\nmedia_group_debounce_ms = 300\n";
    let (_home, gateway) = start(&fake, &config(&fake, files, &echo_in(project.path()))).await;
    let chat = ChatSpec::private(USER);

    let sent = fake.inject_album(&chat, USER, Some("compare these"), &[PNG, PNG_2]);
    let last = sent.last().unwrap().message_id;
    let answer = wait_for_reply(&fake, USER, last, "compare these").await;
    let named = answer.text.matches(".lemon/uploads/photo-").count();
    assert_eq!(named, 2, "both photos in one prompt: {}", answer.text);
    let mut saved: Vec<Vec<u8>> = uploads(project.path())
        .iter()
        .map(|name| std::fs::read(project.path().join(".lemon/uploads").join(name)).unwrap())
        .collect();
    saved.sort();
    let mut sent_bytes = vec![PNG.to_vec(), PNG_2.to_vec()];
    sent_bytes.sort();
    assert_eq!(saved, sent_bytes);
    assert_eq!(runs(&gateway).await, 1, "one run for the album");
    assert!(fake.replies_to(USER, sent[0].message_id).is_empty(), "the first photo got no run");
}
