//! Files users send: what the test registers, `getFile`, and the download
//! route `GET /file/bot<token>/<file_path>` that serves them.
//!
//! A file is registered with its bytes when the test injects a message that
//! carries it; the message announces the size the test chose (the real size
//! unless it says otherwise). `getFile` answers its `file_path`, or Telegram's
//! "file is too big" for one over the Bot API's 20 MB; every download is
//! recorded, so a test can check that a refused file was never fetched.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::Reply;

/// The largest file `getFile` hands out, as Telegram's Bot API.
pub const MAX_GET_FILE_BYTES: u64 = 20 * 1024 * 1024;

/// The registered files and the downloads made.
#[derive(Debug, Default)]
pub(super) struct Served {
    files: BTreeMap<String, ServedFile>,
    next: u64,
    /// `file_path`s downloaded, in order.
    downloads: Vec<String>,
}

#[derive(Debug)]
struct ServedFile {
    unique_id: String,
    path: String,
    bytes: Vec<u8>,
}

impl Served {
    /// Registers `bytes`; its `file_id` and `file_unique_id`. `dir` is the
    /// `file_path`'s folder (`photos`, `documents`, `voice`), `ext` its extension.
    pub(super) fn register(&mut self, bytes: &[u8], dir: &str, ext: &str) -> (String, String) {
        self.next += 1;
        let n = self.next;
        let file_id = format!("AgACAgIAAxkBAAI{n:06}fake");
        let unique_id = format!("AQAD{n:04}fake");
        let path = format!("{dir}/file_{n}.{ext}");
        self.files.insert(
            file_id.clone(),
            ServedFile { unique_id: unique_id.clone(), path, bytes: bytes.to_vec() },
        );
        (file_id, unique_id)
    }

    /// `getFile`.
    pub(super) fn get_file(&self, params: &Map<String, Value>) -> Result<Value, Reply> {
        let id = params.get("file_id").and_then(Value::as_str).unwrap_or_default();
        let Some(file) = self.files.get(id) else {
            return Err(Reply::bad_request("invalid file_id"));
        };
        if file.bytes.len() as u64 > MAX_GET_FILE_BYTES {
            return Err(Reply::bad_request("file is too big"));
        }
        Ok(json!({
            "file_id": id,
            "file_unique_id": file.unique_id,
            "file_size": file.bytes.len(),
            "file_path": file.path,
        }))
    }

    /// The bytes at `path`, recording the download.
    pub(super) fn download(&mut self, path: &str) -> Option<Vec<u8>> {
        let file = self.files.values().find(|f| f.path == path)?;
        let bytes = file.bytes.clone();
        self.downloads.push(path.to_owned());
        Some(bytes)
    }

    pub(super) fn downloads(&self) -> &[String] {
        &self.downloads
    }
}
