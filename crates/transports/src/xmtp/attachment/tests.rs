//! Remote attachments: the derivation against RFC 5869, payloads sealed as a
//! sender's app seals them, and every way a payload can be wrong.

use super::*;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    proto_field(number, bytes)
}

fn seal_for_test(
    plain: &[u8],
    secret: [u8; 32],
    salt: [u8; 32],
    nonce: [u8; 12],
) -> (Vec<u8>, String) {
    let sealed = seal_bytes(plain, secret, salt, nonce);
    (sealed.payload, sealed.digest)
}

const SECRET: [u8; 32] = [7; 32];
const SALT: [u8; 32] = [9; 32];
const NONCE: [u8; 12] = [3; 12];

fn keys(digest: &str) -> Keys {
    let remote = remote("https://files.example/a", digest, None);
    decode_keys(&remote).unwrap()
}

fn remote(url: &str, digest: &str, length: Option<u64>) -> RemoteAttachment {
    RemoteAttachment {
        url: url.to_owned(),
        filename: Some("notes.txt".to_owned()),
        content_length: length,
        secret: b64(&SECRET),
        salt: b64(&SALT),
        nonce: b64(&NONCE),
        content_digest: digest.to_owned(),
        scheme: "https://".to_owned(),
    }
}

#[test]
fn the_key_is_hkdf_sha256_with_empty_info_as_rfc_5869_derives_it() {
    // RFC 5869, test case 3 (salt and info empty): the first 32 bytes of its OKM.
    let key = derive_key(&[0x0b; 22], &[]).unwrap();
    assert_eq!(hex(&key), "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d");
}

#[test]
fn a_sealed_attachment_opens_to_its_name_type_and_bytes() {
    let Sealed { payload, digest } =
        seal("notes.txt", "text/plain", b"remember the milk", SECRET, SALT, NONCE);
    let opened = open(&payload, &keys(&digest)).unwrap();
    assert_eq!(opened.filename.as_deref(), Some("notes.txt"));
    assert_eq!(opened.mime.as_deref(), Some("text/plain"));
    assert_eq!(opened.data, b"remember the milk");
    // The digest is compared whatever case the sender wrote it in.
    assert!(open(&payload, &keys(&digest.to_uppercase())).is_ok());
}

#[test]
fn a_changed_payload_wrong_keys_or_another_content_are_refused() {
    let plain = [field(1, &field(2, b"attachment")), field(4, &[1, 2, 3])].concat();
    let (payload, digest) = seal_for_test(&plain, SECRET, SALT, NONCE);
    assert_eq!(payload.len(), plain.len() + 16, "the tag is appended");
    assert_eq!(open(&payload, &keys(&digest)).unwrap().data, [1, 2, 3]);

    let mut tampered = payload.clone();
    tampered[0] ^= 1;
    assert_eq!(open(&tampered, &keys(&digest)).unwrap_err(), OpenError::Digest);

    // The right digest of a payload sealed under other keys: it does not open.
    let (other, other_digest) = seal_for_test(&plain, [8; 32], SALT, NONCE);
    assert_eq!(
        open(&other, &keys(&other_digest)).unwrap_err(),
        OpenError::Decrypt("the keys do not open it")
    );

    let (text, text_digest) = seal_for_test(
        &[field(1, &field(2, b"text")), field(4, b"hi")].concat(),
        SECRET,
        SALT,
        NONCE,
    );
    assert_eq!(
        open(&text, &keys(&text_digest)).unwrap_err(),
        OpenError::Decrypt("it holds something other than a file")
    );
    let (cut, cut_digest) = seal_for_test(&[0x22, 0x05, b'a'], SECRET, SALT, NONCE);
    assert_eq!(
        open(&cut, &keys(&cut_digest)).unwrap_err(),
        OpenError::Decrypt("its content is cut short")
    );
    let compressed = [plain.clone(), vec![5 << 3, 1]].concat();
    let (zipped, zipped_digest) = seal_for_test(&compressed, SECRET, SALT, NONCE);
    assert_eq!(
        open(&zipped, &keys(&zipped_digest)).unwrap_err(),
        OpenError::Decrypt("it is compressed, which is not supported")
    );
}

#[test]
fn malformed_keys_say_which() {
    let check = |edit: fn(&mut RemoteAttachment), expected: &str| {
        let mut remote = remote("https://files.example/a", &"ab".repeat(32), None);
        edit(&mut remote);
        assert_eq!(decode_keys(&remote).unwrap_err(), expected);
    };
    check(|r| r.secret = b64(&[1; 16]), "its secret is not 32 bytes");
    check(|r| r.salt = "not base64!".to_owned(), "its salt is not 32 bytes");
    check(|r| r.nonce = b64(&[1; 16]), "its nonce is not 12 bytes");
    check(|r| r.content_digest = "zz".repeat(32), "its digest is not a SHA-256");
    check(|r| r.scheme = "ipfs://".to_owned(), "its scheme is not https://");
    // The keys never show in what is logged.
    let shown =
        format!("{:?} {:?}", remote("https://x/secret-path", "00", None), keys(&"00".repeat(32)));
    assert!(!shown.contains(&b64(&SECRET)) && !shown.contains("secret-path"), "{shown}");
}

#[tokio::test]
async fn plain_http_private_hosts_and_announced_sizes_are_refused_before_a_fetch() {
    let home = tempfile::tempdir().unwrap();
    let stage = MediaStage::new(home.path().join("media"));
    let files = FilesConfig::default();
    let public = Fetcher::new(false);
    let check = |refusal: AttachmentRefusal| refusal.to_string();

    let http = remote("http://files.example/a", &"00".repeat(32), None);
    let refused = fetch_open_and_keep(&public, &stage, &files, &http, "attachment").await;
    assert_eq!(check(refused.unwrap_err()), "notes.txt was not fetched: its address is not https");

    let local = remote("https://127.0.0.1:9/a", &"00".repeat(32), None);
    let refused = fetch_open_and_keep(&public, &stage, &files, &local, "attachment").await;
    let text = check(refused.unwrap_err());
    assert!(text.starts_with("the file could not be fetched"), "{text}");

    // 20 MiB is the default limit (README, `[gateway.xmtp.files]`).
    let big = remote("https://files.example/a", &"00".repeat(32), Some(21 * 1024 * 1024));
    let refused = fetch_open_and_keep(&public, &stage, &files, &big, "attachment").await;
    assert_eq!(check(refused.unwrap_err()), "notes.txt is 21.0 MB — the limit is 20.0 MB");

    let mut named = remote("https://files.example/a", &"00".repeat(32), None);
    named.filename = Some("../../.bashrc".to_owned());
    let refused = fetch_open_and_keep(&public, &stage, &files, &named, "attachment").await;
    assert!(check(refused.unwrap_err()).contains("is refused"));
}
