//! Files and voice messages sent to the chat channels, end to end: the real
//! gateway binary, the echo engine (it answers with the prompt it got, so the
//! answer shows the note naming the saved files), and fakes for Discord (its
//! CDN too), the transcription service, Twilio's media and a real IMAP
//! server for mail.

use std::path::Path;

use lemon_tests::fake_discord::{FakeDiscord, FakeMessage, Snapshot, UserFile};
use lemon_tests::fake_transcribe::{speech_ogg, Api, FakeTranscribe};

use crate::discord_e2e::{config, fake, replies, start_in, DM, USER};
use crate::support::{home_with, PATIENCE};

const DISCORD_TOKEN: &str = "discord-test-token-3b9d7e";
const TRANSCRIBE_KEY: &str = "sk-transcribe-test-5d1c";

/// A PNG's first bytes, enough to be taken for one.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01 chart";
const PDF: &[u8] = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n";

/// A home with `config`, the bot token and the transcription keys as secrets.
fn discord_home(config: &str) -> tempfile::TempDir {
    let home = home_with(config);
    let secrets = home.path().join("secrets.toml");
    std::fs::write(
        &secrets,
        format!(
            "discord_bot_token = \"{DISCORD_TOKEN}\"\nopenai_api_key = \"{TRANSCRIBE_KEY}\"\n\
             deepgram_api_key = \"{TRANSCRIBE_KEY}\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&secrets, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .unwrap();
    home
}

/// The echo engine (an OpenAI key among the secrets would otherwise pick
/// the native one), with `default_cwd` set to `project` (runs work, and files
/// land, there).
fn in_project(project: &Path) -> String {
    format!("{ECHO}default_cwd = \"{}\"\n", project.display())
}

const ECHO: &str = "default_engine = \"echo\"\n";

fn uploads(project: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(project.join(".lemon/uploads"))
        .map(|dir| dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

async fn discord_runs(gateway: &crate::support::Gateway) -> usize {
    let runs: serde_json::Value =
        gateway.get("/v1/runs").send().await.unwrap().json().await.unwrap();
    runs["runs"].as_array().map_or(0, Vec::len)
}

/// Waits for one of the bot's replies to `message` (there may be several: a
/// transcript, then the answer) to contain `needle`, with the fake's log on
/// failure.
async fn answer(fake: &FakeDiscord, message: &FakeMessage, needle: &str) -> String {
    let found = |s: &Snapshot<'_>| {
        s.bot_messages(message.channel_id)
            .into_iter()
            .find(|m| m.reply_to == Some(message.id) && m.content.contains(needle))
            .map(|m| m.content.clone())
    };
    let what = format!("a reply to {:?} containing {needle:?}", message.content);
    fake.wait_until(&what, PATIENCE, |s| found(s).is_some()).await;
    fake.snapshot(found).unwrap()
}

#[tokio::test]
async fn a_discord_image_and_a_pdf_land_in_the_uploads_directory_and_the_prompt_names_them() {
    let fake = fake().await;
    let project = tempfile::tempdir().unwrap();
    let home = discord_home(&config(&fake, "", &in_project(project.path())));
    let gateway = start_in(&fake, home.path()).await;

    let files = [
        UserFile::new("chart.png", "image/png", PNG),
        UserFile::new("q3 report.pdf", "application/pdf", PDF),
    ];
    let asked =
        fake.inject_message_with_files(DM, USER, "what do these show?", false, None, &files);
    let text = answer(&fake, &asked, "q3 report.pdf").await;
    assert!(text.starts_with("what do these show?"), "{text}");
    assert!(text.contains(".lemon/uploads/chart.png (image, image/png"), "{text}");
    assert!(text.contains(".lemon/uploads/q3 report.pdf (file, application/pdf"), "{text}");
    let saved = project.path().join(".lemon/uploads");
    assert_eq!(std::fs::read(saved.join("chart.png")).unwrap(), PNG);
    assert_eq!(std::fs::read(saved.join("q3 report.pdf")).unwrap(), PDF);

    // Files alone start a run too, with a default prompt; a name already
    // there gets a fresh one.
    let only = fake.inject_message_with_files(DM, USER, "", false, None, &files[..1]);
    let text = answer(&fake, &only, "chart-1.png").await;
    assert!(text.starts_with("(files attached)"), "{text}");
    assert_eq!(uploads(project.path()), ["chart-1.png", "chart.png", "q3 report.pdf"]);
    // Nothing is left behind in the gateway's stage.
    let stage = home.path().join("media");
    let left = std::fs::read_dir(&stage).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "the stage is empty once the files are placed");
    drop(gateway);
}

#[tokio::test]
async fn oversized_and_hostile_attachments_are_refused_with_a_reply_and_no_run() {
    let fake = fake().await;
    let project = tempfile::tempdir().unwrap();
    let files = "[gateway.discord.files]\nmax_download_bytes = 1024\n";
    let home = discord_home(&config(&fake, files, &in_project(project.path())));
    let gateway = start_in(&fake, home.path()).await;

    // Announced over the limit: refused before a byte is fetched.
    let big = UserFile::new("big.log", "text/plain", &[b'x'; 5000]);
    let asked = fake.inject_message_with_files(DM, USER, "read this", false, None, &[big]);
    let reply = answer(&fake, &asked, "big.log").await;
    assert_eq!(reply, "big.log is 5 KB — the limit is 1 KB");
    // Announced small but larger when it comes: the download stops at the limit.
    let mut liar = UserFile::new("liar.log", "text/plain", &[b'y'; 300_000]);
    liar.announced_size = Some(10);
    let asked = fake.inject_message_with_files(DM, USER, "and this", false, None, &[liar]);
    let reply = answer(&fake, &asked, "liar.log is").await;
    assert!(reply.ends_with("— the limit is 1 KB"), "{reply}");
    // A name with a path in it.
    let hostile = UserFile::new("../../.bashrc", "text/plain", b"rm -rf ~");
    let asked = fake.inject_message_with_files(DM, USER, "", false, None, &[hostile]);
    let reply = answer(&fake, &asked, ".bashrc").await;
    assert_eq!(reply, "the file name \"../../.bashrc\" is refused: it holds a directory");
    // A denied name among good files: nothing is taken.
    let files = [
        UserFile::new("notes.txt", "text/plain", b"fine"),
        UserFile::new("server.pem", "text/plain", b"-----BEGIN"),
    ];
    let asked = fake.inject_message_with_files(DM, USER, "both", false, None, &files);
    let reply = answer(&fake, &asked, "server.pem").await;
    assert!(reply.contains("deny_globs"), "{reply}");

    let fetched = fake.cdn_fetches();
    assert!(!fetched.iter().any(|p| p.contains("big.log")), "never fetched: {fetched:?}");
    assert!(!fetched.iter().any(|p| p.contains("bashrc")), "never fetched: {fetched:?}");
    assert_eq!(discord_runs(&gateway).await, 0, "no run started");
    assert!(uploads(project.path()).is_empty(), "nothing saved: {:?}", uploads(project.path()));
    assert_eq!(replies(&fake, DM, &asked), 1);
}

#[tokio::test]
async fn a_discord_voice_message_is_transcribed_and_its_words_are_the_prompt() {
    let fake = fake().await;
    let service = FakeTranscribe::start(TRANSCRIBE_KEY, "please list the open pull requests").await;
    let voice = format!(
        "voice_transcription = true\nvoice_transcription_model = \"gpt-4o-mini-transcribe\"\n\
         voice_transcription_base_url = \"{}\"\nshow_transcript = true\n",
        service.openai_base_url()
    );
    let project = tempfile::tempdir().unwrap();
    let home = discord_home(&config(&fake, &voice, &in_project(project.path())));
    let gateway = start_in(&fake, home.path()).await;

    let audio = speech_ogg("please list the open pull requests");
    let asked =
        fake.inject_message_with_files(DM, USER, "", false, None, &[UserFile::voice(&audio, 2.5)]);
    let heard = answer(&fake, &asked, "heard:").await;
    assert_eq!(heard, "heard: please list the open pull requests");
    let text = answer(&fake, &asked, "echo resume").await;
    assert!(text.starts_with("please list the open pull requests"), "{text}");
    assert!(!text.contains("Files sent"), "a transcribed note is not a file: {text}");
    let uploads = service.wait_for_uploads(1).await;
    assert_eq!(uploads[0].api, Api::OpenAi);
    assert_eq!(uploads[0].audio, audio, "the recording as sent");
    assert_eq!(uploads[0].model, "gpt-4o-mini-transcribe");
    assert_eq!(uploads[0].auth, format!("Bearer {TRANSCRIBE_KEY}"));
    assert_eq!(uploads[0].mime, "audio/ogg");
    // The heard line came before the answer.
    let bot = fake.bot_messages(DM);
    let order: Vec<bool> = bot.iter().map(|m| m.content.starts_with("heard:")).collect();
    assert_eq!(order, [true, false], "{bot:?}");

    // Too long a note is refused before any upload.
    let long = fake.inject_message_with_files(
        DM,
        USER,
        "",
        false,
        None,
        &[UserFile::voice(&audio, 900.0)],
    );
    let reply = answer(&fake, &long, "long").await;
    assert!(reply.contains("15 min long") && reply.contains("limit"), "{reply}");
    assert_eq!(service.uploads().len(), 1, "nothing uploaded for it");
    drop(gateway);
}

#[tokio::test]
async fn deepgram_transcribes_a_voice_message_without_showing_the_transcript() {
    let fake = fake().await;
    let service = FakeTranscribe::start(TRANSCRIBE_KEY, "deploy the staging site").await;
    let voice = format!(
        "voice_transcription = true\nvoice_transcription_provider = \"deepgram\"\n\
         voice_transcription_base_url = \"{}\"\n",
        service.deepgram_base_url()
    );
    let home = discord_home(&config(&fake, &voice, ECHO));
    let gateway = start_in(&fake, home.path()).await;

    let audio = speech_ogg("deploy the staging site");
    let asked =
        fake.inject_message_with_files(DM, USER, "", false, None, &[UserFile::voice(&audio, 1.8)]);
    let text = answer(&fake, &asked, "echo resume").await;
    assert!(text.starts_with("deploy the staging site"), "{text}");
    let upload = &service.wait_for_uploads(1).await[0];
    assert_eq!(upload.api, Api::Deepgram);
    assert_eq!(
        (upload.model.as_str(), upload.auth.as_str()),
        ("nova-3", "Token sk-transcribe-test-5d1c")
    );
    assert_eq!(upload.audio, audio);
    assert!(
        !fake.bot_messages(DM).iter().any(|m| m.content.starts_with("heard:")),
        "show_transcript is off by default"
    );
    // The service failing is told plainly, and no run starts.
    service.fail_with(500, "model overloaded");
    let again =
        fake.inject_message_with_files(DM, USER, "", false, None, &[UserFile::voice(&audio, 1.8)]);
    let reply = answer(&fake, &again, "transcription service").await;
    assert_eq!(reply, "the transcription service answered 500: model overloaded");
    assert!(!reply.contains(TRANSCRIBE_KEY));
    drop(gateway);
}

/// A mail from Alice with a text part and `parts` (each a full MIME part
/// with its headers), as a mail client writes one.
fn mail_with_parts(message_id: &str, text: &str, parts: &[String]) -> String {
    use crate::email_e2e::{ALICE, SMTP_USER};
    let mut body =
        format!("--mixed-b1\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{text}\r\n");
    for part in parts {
        body.push_str(&format!("--mixed-b1\r\n{part}\r\n"));
    }
    body.push_str("--mixed-b1--\r\n");
    format!(
        "From: Alice <{ALICE}>\r\nTo: {SMTP_USER}\r\nSubject: Files\r\nMessage-ID: <{message_id}>\r\n\
         Date: Tue, 1 Dec 2026 10:00:00 +0000\r\nMIME-Version: 1.0\r\n\
         Content-Type: multipart/mixed; boundary=\"mixed-b1\"\r\n\r\n{body}"
    )
}

/// A base64 MIME part.
fn part(headers: &str, bytes: &[u8]) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let lines: Vec<&str> =
        encoded.as_bytes().chunks(76).map(|chunk| std::str::from_utf8(chunk).unwrap()).collect();
    format!("{headers}\r\nContent-Transfer-Encoding: base64\r\n\r\n{}", lines.join("\r\n"))
}

#[tokio::test]
async fn an_email_attachment_lands_in_uploads_inline_images_count_and_big_ones_are_listed() {
    use lemon_tests::dovecot::Dovecot;
    use lemon_tests::fake_smtp::FakeSmtp;

    let imap = Dovecot::start(crate::support::PATIENCE).await;
    let smtp = FakeSmtp::start().await;
    let project = tempfile::tempdir().unwrap();
    let config = format!(
        "[gateway]\n{}\n{}[gateway.email.files]\nmax_download_bytes = 4096\n",
        in_project(project.path()),
        crate::email_e2e::config(Some(&imap), &smtp, false)
    );
    let home = home_with(&config);
    crate::email_e2e::secrets(home.path());
    let gateway = crate::email_e2e::start(home.path()).await;

    let parts = [
        part(
            "Content-Type: application/pdf; name=\"report.pdf\"\r\n\
             Content-Disposition: attachment; filename=\"report.pdf\"",
            PDF,
        ),
        part(
            "Content-Type: image/png\r\nContent-ID: <logo@example.com>\r\nContent-Disposition: inline",
            PNG,
        ),
        part(
            "Content-Type: text/plain; name=\"../../.bashrc\"\r\n\
             Content-Disposition: attachment; filename=\"../../.bashrc\"",
            b"alias ls='rm -rf ~'",
        ),
        part(
            "Content-Type: text/plain; name=\"big.log\"\r\n\
             Content-Disposition: attachment; filename=\"big.log\"",
            &[b'z'; 5000],
        ),
    ];
    imap.append(&mail_with_parts("files1@example.com", "Please read the report.", &parts)).await;
    let mails = smtp.wait_for("the answer", crate::support::PATIENCE, |m| !m.is_empty()).await;
    let text = crate::email_e2e::plain(&mails[0]);
    assert!(text.contains("Please read the report."), "{text}");
    assert!(text.contains(".lemon/uploads/report.pdf (file, application/pdf"), "{text}");
    assert!(text.contains(".lemon/uploads/image-2.png (image, image/png"), "{text}");
    assert!(text.contains("big.log is 5 KB — the limit is 4 KB"), "{text}");
    let saved = project.path().join(".lemon/uploads");
    assert_eq!(std::fs::read(saved.join("report.pdf")).unwrap(), PDF);
    assert_eq!(std::fs::read(saved.join("image-2.png")).unwrap(), PNG);
    // The hostile name lost its path: it is a plain file in the uploads.
    assert_eq!(uploads(project.path()), ["bashrc", "image-2.png", "report.pdf"]);
    assert!(!project.path().join(".bashrc").exists());
    gateway.terminate().await;
}

#[tokio::test]
async fn an_mms_picture_is_fetched_from_twilio_and_lands_in_uploads() {
    use crate::sms_e2e::{
        deliver, inbound, sms_addr, sms_config, write_secrets, ACCOUNT_SID, FRIEND,
    };
    use lemon_tests::fake_twilio::FakeTwilio;

    let twilio = FakeTwilio::start(ACCOUNT_SID, crate::sms_e2e::AUTH_TOKEN).await;
    let project = tempfile::tempdir().unwrap();
    let config = format!(
        "[gateway]\n{}\n{}",
        in_project(project.path()),
        sms_config(&twilio, "reply_to_allowed = true\n")
    );
    let home = home_with(&config);
    write_secrets(home.path(), "");
    let gateway = crate::support::Gateway::start_in(home.path()).await;
    let addr = sms_addr(&gateway).await;

    let sid = "SM0000000000000000000000000000f11e";
    let jpeg = b"\xff\xd8\xff\xe0\0\x10JFIF\0 a photo";
    let url = twilio.add_media(ACCOUNT_SID, sid, "image/jpeg", jpeg);
    let mut params = inbound(sid, FRIEND, "what is in this photo?");
    params.retain(|(key, _)| *key != "NumMedia");
    params.push(("NumMedia", "1".to_owned()));
    params.push(("MediaUrl0", url));
    params.push(("MediaContentType0", "image/jpeg".to_owned()));
    deliver(&addr, &params).await;
    let answered = twilio.wait_for_requests(1, crate::support::PATIENCE).await;
    let body = answered[0].field("Body").unwrap_or_default().to_owned();
    assert!(body.starts_with("what is in this photo?"), "{body}");
    assert!(body.contains(".lemon/uploads/mms-1.jpg (image, image/jpeg"), "{body}");
    assert_eq!(std::fs::read(project.path().join(".lemon/uploads/mms-1.jpg")).unwrap(), jpeg);
    let fetches = twilio.media_fetches();
    assert_eq!(fetches.len(), 2, "the media URL, then its file: {fetches:?}");
    assert!(fetches[0].authorized && fetches[0].status == 307, "{fetches:?}");
    assert_eq!((fetches[1].path.starts_with("/cdn/"), fetches[1].status), (true, 200));

    // A media URL that is not Twilio's is never fetched; the sender is told.
    let other = "SM0000000000000000000000000000f12e";
    let mut params = inbound(other, FRIEND, "");
    params.retain(|(key, _)| *key != "NumMedia");
    params.push(("NumMedia", "1".to_owned()));
    params.push(("MediaUrl0", "https://files.example.test/photo.jpg".to_owned()));
    params.push(("MediaContentType0", "image/jpeg".to_owned()));
    deliver(&addr, &params).await;
    let answered = twilio.wait_for_requests(2, crate::support::PATIENCE).await;
    assert_eq!(
        answered[1].field("Body"),
        Some("the file could not be fetched: mms-1.jpg is not on Twilio's API host")
    );
    assert_eq!(twilio.media_fetches().len(), 2, "nothing more fetched");
    gateway.terminate().await;
}
