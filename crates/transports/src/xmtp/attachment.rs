//! XMTP remote attachments: the bridge forwards only what the sender's
//! message says (a URL, a name, a length and the keys); the gateway fetches
//! the encrypted bytes with the channel's capped, address-checked
//! [`Fetcher`], checks them against the sender's digest, decrypts them and
//! keeps the file for the run.
//!
//! The scheme is XMTP's `remoteStaticAttachment` (content type
//! `xmtp.org/remoteStaticAttachment:1.0`): the payload is AES-256-GCM (its
//! 16-byte tag at the end, no associated data) under a key derived with
//! HKDF-SHA256 from the 32-byte secret and 32-byte salt (empty info), with a
//! 12-byte nonce; `contentDigest` is the lowercase hex SHA-256 of the payload.
//! The plaintext is an `EncodedContent` protobuf whose `parameters` hold
//! `filename` and `mimeType` and whose `content` is the file.
//!
//! Nothing here logs or shows the secret, the salt, the nonce or the URL.

use base64::Engine as _;
use lemon_core::media::{check_file_name, Attachment, FilesConfig, MediaRefusal, MediaStage};
use ring::{aead, hkdf};
use sha2::{Digest, Sha256};

use super::protocol::RemoteAttachment;
use crate::media::{self, Fetcher};

/// The only scheme taken (the bridge passes the sender's own word on).
pub const SCHEME: &str = "https://";
/// What the encrypted envelope may add to a file (the tag, the protobuf's
/// fields and parameters): the fetch stops at `max_download_bytes` plus this.
pub const ENVELOPE_ALLOWANCE: u64 = 64 * 1024;
const TAG_LEN: usize = 16;
const SECRET_LEN: usize = 32;
const SALT_LEN: usize = 32;
const NONCE_LEN: usize = 12;

/// Why an attachment was not taken; its text is the reply in the conversation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachmentRefusal {
    #[error(transparent)]
    Media(#[from] MediaRefusal),
    #[error("{name} was not fetched: its address is not https")]
    NotHttps { name: String },
    #[error("{name} was refused: its bytes do not match the digest the sender gave")]
    Digest { name: String },
    #[error("{name} could not be decrypted: {why}")]
    Decrypt { name: String, why: &'static str },
}

/// The decryption parameters, decoded.
struct Keys {
    secret: [u8; SECRET_LEN],
    salt: [u8; SALT_LEN],
    nonce: [u8; NONCE_LEN],
    digest: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(<redacted>)")
    }
}

fn decode_keys(remote: &RemoteAttachment) -> Result<Keys, &'static str> {
    fn fixed<const N: usize>(text: &str, why: &'static str) -> Result<[u8; N], &'static str> {
        let bytes =
            base64::engine::general_purpose::STANDARD.decode(text.trim()).map_err(|_| why)?;
        bytes.try_into().map_err(|_| why)
    }
    if !remote.scheme.eq_ignore_ascii_case(SCHEME) {
        return Err("its scheme is not https://");
    }
    let digest_text = remote.content_digest.trim();
    let mut digest = [0u8; 32];
    if digest_text.len() != 64 || !digest_text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("its digest is not a SHA-256");
    }
    for (n, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&digest_text[2 * n..2 * n + 2], 16)
            .map_err(|_| "its digest is not a SHA-256")?;
    }
    Ok(Keys {
        secret: fixed(&remote.secret, "its secret is not 32 bytes")?,
        salt: fixed(&remote.salt, "its salt is not 32 bytes")?,
        nonce: fixed(&remote.nonce, "its nonce is not 12 bytes")?,
        digest,
    })
}

/// A decrypted attachment.
#[derive(Clone, PartialEq, Eq)]
pub struct Opened {
    pub filename: Option<String>,
    pub mime: Option<String>,
    pub data: Vec<u8>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("filename", &self.filename)
            .field("mime", &self.mime)
            .field("data", &self.data.len())
            .finish()
    }
}

/// Why a payload did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenError {
    Digest,
    Decrypt(&'static str),
}

/// Checks `payload` against the digest, decrypts it and reads the attachment.
///
/// # Errors
/// [`OpenError::Digest`] when the payload is not the one the sender hashed,
/// else [`OpenError::Decrypt`] saying what is wrong.
fn open(payload: &[u8], keys: &Keys) -> Result<Opened, OpenError> {
    let digest: [u8; 32] = Sha256::digest(payload).into();
    if digest != keys.digest {
        return Err(OpenError::Digest);
    }
    if payload.len() < TAG_LEN {
        return Err(OpenError::Decrypt("it is shorter than its tag"));
    }
    let key = derive_key(&keys.secret, &keys.salt)
        .ok_or(OpenError::Decrypt("no key could be derived"))?;
    let key = aead::UnboundKey::new(&aead::AES_256_GCM, &key)
        .map_err(|_| OpenError::Decrypt("no key could be derived"))?;
    let key = aead::LessSafeKey::new(key);
    let mut buffer = payload.to_vec();
    let plain = key
        .open_in_place(
            aead::Nonce::assume_unique_for_key(keys.nonce),
            aead::Aad::empty(),
            &mut buffer,
        )
        .map_err(|_| OpenError::Decrypt("the keys do not open it"))?;
    encoded_content(plain).map_err(OpenError::Decrypt)
}

/// The AES-256 key: HKDF-SHA256 of `secret` with `salt`, empty info.
fn derive_key(secret: &[u8], salt: &[u8]) -> Option<[u8; 32]> {
    struct Len32;
    impl hkdf::KeyType for Len32 {
        fn len(&self) -> usize {
            32
        }
    }
    let mut key = [0u8; 32];
    hkdf::Salt::new(hkdf::HKDF_SHA256, salt)
        .extract(secret)
        .expand(&[], Len32)
        .ok()?
        .fill(&mut key)
        .ok()?;
    Some(key)
}

/// Reads an `EncodedContent` protobuf: `type` (1), `parameters` (2, a map),
/// `fallback` (3), `content` (4), `compression` (5).
fn encoded_content(bytes: &[u8]) -> Result<Opened, &'static str> {
    let mut reader = Proto { bytes };
    let (mut filename, mut mime, mut data, mut type_id) = (None, None, None, None);
    while let Some((field, value)) = reader.field()? {
        match (field, value) {
            (1, Value::Bytes(ty)) => {
                let mut ty = Proto { bytes: ty };
                while let Some((field, value)) = ty.field()? {
                    if let (2, Value::Bytes(id)) = (field, value) {
                        type_id = Some(String::from_utf8_lossy(id).into_owned());
                    }
                }
            }
            (2, Value::Bytes(entry)) => {
                let mut entry = Proto { bytes: entry };
                let (mut key, mut val) = (None, None);
                while let Some((field, value)) = entry.field()? {
                    match (field, value) {
                        (1, Value::Bytes(k)) => key = Some(String::from_utf8_lossy(k).into_owned()),
                        (2, Value::Bytes(v)) => val = Some(String::from_utf8_lossy(v).into_owned()),
                        _ => {}
                    }
                }
                match key.as_deref() {
                    Some("filename") => filename = val,
                    Some("mimeType") => mime = val,
                    _ => {}
                }
            }
            (4, Value::Bytes(content)) => data = Some(content.to_vec()),
            (5, Value::Varint(0)) => {}
            (5, Value::Varint(_)) => return Err("it is compressed, which is not supported"),
            _ => {}
        }
    }
    if type_id.as_deref().is_some_and(|id| id != "attachment") {
        return Err("it holds something other than a file");
    }
    let data = data.ok_or("it holds no file")?;
    Ok(Opened { filename, mime: mime.filter(|m| !m.trim().is_empty()), data })
}

enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// A protobuf reader for the few wire types an `EncodedContent` uses.
struct Proto<'a> {
    bytes: &'a [u8],
}

impl<'a> Proto<'a> {
    fn varint(&mut self) -> Result<u64, &'static str> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.bytes.split_first().ok_or("its content is cut short")?;
            self.bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("its content is malformed")
    }

    fn field(&mut self) -> Result<Option<(u64, Value<'a>)>, &'static str> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => Value::Bytes(self.take(8)?),
            2 => {
                let len =
                    usize::try_from(self.varint()?).map_err(|_| "its content is malformed")?;
                Value::Bytes(self.take(len)?)
            }
            5 => Value::Bytes(self.take(4)?),
            _ => return Err("its content is malformed"),
        };
        Ok(Some((key >> 3, value)))
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], &'static str> {
        if len > self.bytes.len() {
            return Err("its content is cut short");
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }
}

/// Fetches `remote` within `files`' limits, checks and decrypts it, and keeps
/// the file in `stage`. Only `https` URLs are fetched unless `fetcher`
/// reaches private addresses (the XMTP network is on this machine).
///
/// # Errors
/// An [`AttachmentRefusal`] the sender is told.
pub async fn fetch_open_and_keep(
    fetcher: &Fetcher,
    stage: &MediaStage,
    files: &FilesConfig,
    remote: &RemoteAttachment,
    fallback: &str,
) -> Result<Attachment, AttachmentRefusal> {
    let announced = remote.filename.as_deref().filter(|n| !n.trim().is_empty());
    let name = check_file_name(announced.unwrap_or(fallback))?;
    if let Some(glob) = files.denied_by(&name) {
        return Err(MediaRefusal::Denied { name, glob }.into());
    }
    let max = files.max_download_bytes;
    if let Some(size) = remote.content_length.filter(|size| *size > max) {
        return Err(MediaRefusal::TooLarge { name, bytes: size, max }.into());
    }
    let keys = decode_keys(remote)
        .map_err(|why| AttachmentRefusal::Decrypt { name: name.clone(), why })?;
    let https = reqwest::Url::parse(remote.url.trim()).is_ok_and(|url| url.scheme() == "https");
    if !https && !fetcher.allows_private() {
        return Err(AttachmentRefusal::NotHttps { name });
    }
    let cap = max.saturating_add(ENVELOPE_ALLOWANCE);
    let payload = match fetcher.fetch(&remote.url, &name, cap, None).await {
        Ok(downloaded) => downloaded.bytes,
        // The envelope's allowance is the gateway's business: the sender is
        // told the limit they can act on.
        Err(MediaRefusal::TooLarge { bytes, .. }) => {
            return Err(MediaRefusal::TooLarge { name, bytes: bytes.max(max + 1), max }.into())
        }
        Err(refusal) => return Err(refusal.into()),
    };
    let opened = tokio::task::spawn_blocking(move || open(&payload, &keys))
        .await
        .unwrap_or(Err(OpenError::Decrypt("it could not be decrypted here")))
        .map_err(|error| match error {
            OpenError::Digest => AttachmentRefusal::Digest { name: name.clone() },
            OpenError::Decrypt(why) => AttachmentRefusal::Decrypt { name: name.clone(), why },
        })?;
    let bytes = opened.data.len() as u64;
    if bytes > max {
        return Err(MediaRefusal::TooLarge { name, bytes, max }.into());
    }
    // The name the sender's message announced is the one checked and shown;
    // the one inside is only a fallback for a message without one.
    let name = match (announced, opened.filename.as_deref()) {
        (None, Some(inner)) if !inner.trim().is_empty() => check_file_name(inner)?,
        _ => name,
    };
    if let Some(glob) = files.denied_by(&name) {
        return Err(MediaRefusal::Denied { name, glob }.into());
    }
    Ok(media::keep(stage, files, name, opened.mime, opened.data).await?)
}

/// A file encrypted as a sender's app encrypts it: the payload to serve and
/// its digest (lowercase hex). The gateway never sends attachments; this is
/// `open`'s other half, for the tests and the fake bridge.
#[derive(Debug, Clone)]
pub struct Sealed {
    pub payload: Vec<u8>,
    pub digest: String,
}

/// Seals `data` as an attachment named `filename` of type `mime` with these
/// keys ([`Sealed`]).
pub fn seal(
    filename: &str,
    mime: &str,
    data: &[u8],
    secret: [u8; 32],
    salt: [u8; 32],
    nonce: [u8; 12],
) -> Sealed {
    let type_id = [proto_field(1, b"xmtp.org"), proto_field(2, b"attachment"), vec![3 << 3, 1]];
    let parameter = |key: &str, value: &str| {
        proto_field(2, &[proto_field(1, key.as_bytes()), proto_field(2, value.as_bytes())].concat())
    };
    let plain = [
        proto_field(1, &type_id.concat()),
        parameter("filename", filename),
        parameter("mimeType", mime),
        proto_field(4, data),
    ]
    .concat();
    seal_bytes(&plain, secret, salt, nonce)
}

/// Seals `plain` (an `EncodedContent`, or anything for a test) with these keys.
fn seal_bytes(plain: &[u8], secret: [u8; 32], salt: [u8; 32], nonce: [u8; 12]) -> Sealed {
    let mut payload = plain.to_vec();
    // A 32-byte key is always an AES-256 key, and sealing fails only on
    // inputs of gigabytes; a failure leaves a payload that will not open.
    if let Some(Ok(key)) =
        derive_key(&secret, &salt).map(|key| aead::UnboundKey::new(&aead::AES_256_GCM, &key))
    {
        let _ = aead::LessSafeKey::new(key).seal_in_place_append_tag(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::empty(),
            &mut payload,
        );
    }
    let digest = Sha256::digest(&payload).iter().map(|b| format!("{b:02x}")).collect();
    Sealed { payload, digest }
}

/// A protobuf length-delimited field.
fn proto_field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2];
    let mut len = bytes.len();
    loop {
        let byte = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(bytes);
    out
}

#[cfg(test)]
mod tests;
