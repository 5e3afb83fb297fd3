//! Files sent with a request: base64 measured before it is decoded, `data:`
//! URLs, names checked before anything is fetched, downloads capped and kept
//! off private addresses unless allowed, and all-or-nothing staging.

use std::net::SocketAddr;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use base64::Engine as _;
use lemon_core::media::{AttachmentKind, FilesConfig, MediaRefusal, MediaStage};

use super::*;

const PDF: &[u8] = b"%PDF-1.7\nhello\n%%EOF\n";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn inline(label: &str, name: Option<&str>, data: &str) -> IncomingFile {
    IncomingFile {
        label: label.to_owned(),
        name: name.map(str::to_owned),
        mime: None,
        source: FileSource::Base64(data.to_owned()),
    }
}

fn by_url(label: &str, name: Option<&str>, url: &str) -> IncomingFile {
    IncomingFile {
        label: label.to_owned(),
        name: name.map(str::to_owned),
        mime: None,
        source: FileSource::Url(url.to_owned()),
    }
}

/// A stage in a fresh directory, and how many files it holds.
struct Stage {
    dir: tempfile::TempDir,
    stage: MediaStage,
}

impl Stage {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let stage = MediaStage::new(dir.path().join("stage"));
        Stage { dir, stage }
    }

    fn files(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(self.dir.path().join("stage")) else { return 0 };
        entries.count()
    }
}

fn allowing_private(max: u64) -> FilesConfig {
    FilesConfig { max_download_bytes: max, allow_private_hosts: true, ..FilesConfig::default() }
}

/// A file server on loopback: `/report.pdf`, `/named` (a hostile
/// `Content-Disposition` name), `/big` (no length, more than 64 bytes),
/// `/moved` (a redirect to `/report.pdf`), `/gone` (404).
async fn file_server() -> SocketAddr {
    let app = Router::new()
        .route("/report.pdf", get(|| async { ([(header::CONTENT_TYPE, "application/pdf")], PDF) }))
        .route(
            "/named",
            get(|| async {
                ([(header::CONTENT_DISPOSITION, "attachment; filename=\"../../.bashrc\"")], PDF)
            }),
        )
        .route(
            "/big",
            get(|| async {
                let chunks = (0..10).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 32]));
                axum::body::Body::from_stream(futures::stream::iter(chunks))
            }),
        )
        .route(
            "/moved",
            get(|| async {
                (StatusCode::FOUND, [(header::LOCATION, "/report.pdf")]).into_response()
            }),
        )
        .route("/gone", get(|| async { StatusCode::NOT_FOUND }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[test]
fn decoded_sizes_are_counted_without_decoding() {
    for (text, want) in [
        ("", 0),
        ("QQ==", 1),
        ("QQ", 1),
        ("QUI=", 2),
        ("QUJD", 3),
        ("QUJD\nREVG\r\n", 6),
        ("QUJDREVGRw", 7),
    ] {
        assert_eq!(decoded_len(text), Ok(want), "{text:?}");
    }
    for bad in ["Q", "QQ=A", "QQ==="] {
        assert!(decoded_len(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn base64_over_the_limit_is_refused_before_it_is_decoded() {
    // Not base64 at its end: decoding would fail, but the size is judged first.
    let text = format!("{}!!!!", "A".repeat(4 * 100));
    match decode_base64(&text, 64, "big.bin") {
        Err(Refusal::Media(MediaRefusal::TooLarge { bytes, max, .. })) => {
            assert_eq!((bytes, max), (303, 64));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(decode_base64("QQ!=", 64, "x"), Err(Refusal::Invalid(_))));
    assert_eq!(decode_base64(&b64(PDF), 64, "a.pdf").unwrap(), PDF);
    // URL-safe, unpadded, with line breaks: as senders write it.
    let url_safe = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xfb, 0xff, 0xfe]);
    assert_eq!(decode_base64(&format!("{url_safe}\n"), 64, "x").unwrap(), [0xfb, 0xff, 0xfe]);
}

#[test]
fn data_urls_give_their_type_and_base64() {
    assert_eq!(
        parse_data_url("data:image/png;base64,iVBORw0K"),
        Some(Ok((Some("image/png".to_owned()), "iVBORw0K")))
    );
    assert_eq!(parse_data_url("DATA:;base64,QQ=="), Some(Ok((None, "QQ=="))));
    assert!(parse_data_url("data:text/plain,hello").unwrap().is_err());
    assert!(parse_data_url("data:image/png;base64").unwrap().is_err());
    assert_eq!(parse_data_url("https://example.com/a.png"), None);
}

#[test]
fn the_body_limit_follows_the_largest_file_in_base64() {
    let files = |max| FilesConfig { max_download_bytes: max, ..FilesConfig::default() };
    assert_eq!(body_limit(&files(30 * 1024 * 1024), 1024), 40 * 1024 * 1024 + 64 * 1024);
    assert_eq!(body_limit(&files(10), 1024 * 1024), 1024 * 1024);
    let off = FilesConfig { enabled: false, ..files(30 * 1024 * 1024) };
    assert_eq!(body_limit(&off, 1024), 1024);
}

#[test]
fn content_disposition_and_url_names() {
    assert_eq!(disposition_name("attachment; filename=\"a b.pdf\""), Some("a b.pdf".to_owned()));
    assert_eq!(
        disposition_name("attachment; filename=x.pdf; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf"),
        Some("résumé.pdf".to_owned())
    );
    assert_eq!(disposition_name("inline"), None);
    let url = reqwest::Url::parse("https://h.example/dir/my%20notes.txt?sig=secret").unwrap();
    assert_eq!(last_segment(&url), Some("my notes.txt".to_owned()));
    assert_eq!(last_segment(&reqwest::Url::parse("https://h.example/").unwrap()), None);
}

#[tokio::test]
async fn base64_and_data_url_files_are_staged_with_their_kind() {
    let s = Stage::new();
    let files = FilesConfig::default();
    let incoming = vec![
        inline("attachments[0]", Some("report.pdf"), &b64(PDF)),
        by_url("content[1]", None, &format!("data:image/png;base64,{}", b64(PNG))),
    ];
    let staged = receive(&s.stage, &files, incoming).await.unwrap();
    let [pdf, png] = staged.attachments() else { panic!("{staged:?}") };
    assert_eq!(
        (pdf.name.as_str(), pdf.kind, pdf.mime.as_str()),
        ("report.pdf", AttachmentKind::File, "application/pdf")
    );
    assert_eq!(std::fs::read(&pdf.path).unwrap(), PDF);
    assert_eq!((png.name.as_str(), png.kind), ("attachment-2.png", AttachmentKind::Image));
    assert_eq!(s.files(), 2);
    staged.hand_over();
    assert_eq!(s.files(), 2, "handed over, the files stay for the run");
}

#[tokio::test]
async fn one_refused_file_removes_the_others_and_names_itself() {
    let s = Stage::new();
    let files = FilesConfig { max_download_bytes: 8, ..FilesConfig::default() };
    let incoming = vec![
        inline("attachments[0]", Some("ok.txt"), &b64(b"fine")),
        inline("attachments[1]", Some("big.txt"), &b64(b"far too long")),
    ];
    let err = receive(&s.stage, &files, incoming).await.unwrap_err();
    assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        err.to_string(),
        "attachments[1] (big.txt): big.txt is 12 bytes — the limit is 8 bytes"
    );
    assert_eq!(s.files(), 0, "nothing of the request stays");

    let dropped = receive(&s.stage, &files, vec![inline("a", Some("ok.txt"), &b64(b"ok"))]);
    drop(dropped.await.unwrap());
    assert_eq!(s.files(), 0, "files not handed over go when dropped");
}

#[tokio::test]
async fn bad_names_bad_base64_and_disabled_files_are_refused() {
    let s = Stage::new();
    let files = FilesConfig::default();
    let check = |err: AttachmentError, status: StatusCode, text: &str| {
        assert_eq!(err.status(), status, "{err}");
        assert!(err.to_string().contains(text), "{err}");
    };
    // The name is judged before the URL is fetched (nothing listens there).
    let err = receive(
        &s.stage,
        &files,
        vec![by_url("a[0]", Some("../../.bashrc"), "http://127.0.0.1:1/x")],
    )
    .await
    .unwrap_err();
    check(err, StatusCode::BAD_REQUEST, "it holds a directory");
    let err = receive(&s.stage, &files, vec![inline("a[0]", Some(".env"), &b64(b"K=1"))])
        .await
        .unwrap_err();
    check(err, StatusCode::BAD_REQUEST, "deny_globs");
    let err = receive(&s.stage, &files, vec![inline("a[0]", Some("x.txt"), "not base64!")])
        .await
        .unwrap_err();
    check(err, StatusCode::BAD_REQUEST, "a[0] (x.txt): it is not base64");
    let err = receive(&s.stage, &files, vec![by_url("a[0]", None, "ftp://h.example/x")])
        .await
        .unwrap_err();
    check(err, StatusCode::BAD_REQUEST, "http, https or data");
    let off = FilesConfig { enabled: false, ..FilesConfig::default() };
    let err =
        receive(&s.stage, &off, vec![inline("a[0]", Some("x.txt"), &b64(b"x"))]).await.unwrap_err();
    check(err, StatusCode::FORBIDDEN, "files are not accepted here");
    let many = (0..=MAX_FILES).map(|i| inline("a", Some(&format!("{i}.txt")), "QQ==")).collect();
    let err = receive(&s.stage, &files, many).await.unwrap_err();
    check(err, StatusCode::BAD_REQUEST, "at most 16 files");
    assert_eq!(s.files(), 0);
}

#[tokio::test]
async fn urls_on_private_addresses_are_refused_unless_allowed() {
    let addr = file_server().await;
    let s = Stage::new();
    for url in [
        format!("http://{addr}/report.pdf"),
        format!("http://localhost:{}/report.pdf", addr.port()),
        format!("http://[::ffff:127.0.0.1]:{}/report.pdf", addr.port()),
    ] {
        let err = receive(&s.stage, &FilesConfig::default(), vec![by_url("a[0]", None, &url)])
            .await
            .unwrap_err();
        assert_eq!(err.status(), StatusCode::UNPROCESSABLE_ENTITY, "{url}: {err}");
        assert!(err.to_string().contains("private or loopback"), "{err}");
    }
    let allowed = allowing_private(1024);
    let url = format!("http://{addr}/report.pdf");
    let staged = receive(&s.stage, &allowed, vec![by_url("a[0]", None, &url)]).await.unwrap();
    let [pdf] = staged.attachments() else { panic!("{staged:?}") };
    assert_eq!((pdf.name.as_str(), pdf.mime.as_str()), ("report.pdf", "application/pdf"));
    assert_eq!(std::fs::read(&pdf.path).unwrap(), PDF);
    // A name with several addresses (`::1` first, say) reaches the one that answers.
    let url = format!("http://localhost:{}/report.pdf", addr.port());
    let staged = receive(&s.stage, &allowed, vec![by_url("a[0]", None, &url)]).await.unwrap();
    assert_eq!(std::fs::read(&staged.attachments()[0].path).unwrap(), PDF);
}

#[tokio::test]
async fn downloads_are_capped_redirects_followed_and_names_sanitised() {
    let addr = file_server().await;
    let s = Stage::new();
    let files = allowing_private(64);
    let url = |path: &str| format!("http://{addr}{path}");

    let err =
        receive(&s.stage, &files, vec![by_url("a[0]", None, &url("/big"))]).await.unwrap_err();
    assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE, "{err}");
    let err =
        receive(&s.stage, &files, vec![by_url("a[0]", None, &url("/gone"))]).await.unwrap_err();
    assert_eq!(err.status(), StatusCode::UNPROCESSABLE_ENTITY, "{err}");
    assert!(err.to_string().contains("404"), "{err}");

    let staged = receive(
        &s.stage,
        &files,
        vec![by_url("a[0]", None, &url("/moved")), by_url("a[1]", None, &url("/named"))],
    )
    .await
    .unwrap();
    let [moved, named] = staged.attachments() else { panic!("{staged:?}") };
    assert_eq!(moved.name, "report.pdf");
    // A server's hostile name is not the sender's: a safe name is used.
    assert_eq!(named.name, "named");
    assert_eq!(std::fs::read(&named.path).unwrap(), PDF);
}
