//! A webhook body normalised: the prompt text, the attachments and the metadata,
//! accepting the shapes Zapier, n8n and Make send.
//!
//! - Text: the first non-blank of `prompt`, `text`, `message`, `input`,
//!   `body.text` and `content.text` (nested objects, or those literal keys).
//! - Attachments: `attachments` and `files` (objects with `url`/`href`/`uri`,
//!   `name`/`filename`/`file_name`/`title`, `content_type`/`mime_type`/`type`,
//!   `size`/`bytes`, the content in base64 as `data`/`content_base64`/`base64`/
//!   `file_data`, or plain URL strings) and `urls` (strings), as lists or
//!   single values; a string holding a JSON list or object is read as that. A
//!   `data:` URL is content, not a link. Entries with no URL, name or content
//!   are dropped, duplicates kept once.
//! - The prompt is the text, then an `Attachments:` section with one line per
//!   attachment (`- name (url)`, `- url` or `- name`; content is never
//!   written there); with no text it is the section alone.
//! - Metadata: an object, or a string holding a JSON object; absent means `{}`.

use serde_json::{json, Map, Value};

use super::{first_string, nested_string};

/// Most attachments one request may carry.
pub(crate) const MAX_ATTACHMENTS: usize = 100;

/// How deep attachment lists and wrapper objects are followed.
const MAX_DEPTH: usize = 8;

/// Where the text may be, in order of precedence.
const TEXT_KEYS: [&str; 4] = ["prompt", "text", "message", "input"];

/// The body fields attachments come from, with the name each is reported under.
const ATTACHMENT_FIELDS: [&str; 3] = ["attachments", "files", "urls"];

/// One attachment, as the prompt lists it and `meta.webhook` and callbacks carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attachment {
    /// The body field it came from: `attachments`, `files` or `urls`.
    pub(crate) source: &'static str,
    pub(crate) url: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) content_type: Option<String>,
    pub(crate) size: Option<u64>,
    /// The content in base64 (or a `data:` URL), when the payload carries
    /// it; never in the prompt, the run's record or a callback.
    pub(crate) data: Option<String>,
}

impl Attachment {
    /// `{"source", "url"?, "name"?, "content_type"?, "size"?}`.
    pub(crate) fn to_json(&self) -> Value {
        let mut out = Map::new();
        out.insert("source".to_owned(), json!(self.source));
        let fields =
            [("url", &self.url), ("name", &self.name), ("content_type", &self.content_type)];
        for (key, value) in fields {
            if let Some(value) = value {
                out.insert(key.to_owned(), json!(value));
            }
        }
        if let Some(size) = self.size {
            out.insert("size".to_owned(), json!(size));
        }
        Value::Object(out)
    }

    /// The prompt's line for it.
    fn line(&self) -> String {
        match (&self.name, &self.url) {
            (Some(name), Some(url)) => format!("- {name} ({url})"),
            (None, Some(url)) => format!("- {url}"),
            (Some(name), None) => format!("- {name}"),
            (None, None) => "- (a file without a name)".to_owned(),
        }
    }
}

/// A normalised body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Payload {
    /// The text followed by the `Attachments:` section.
    pub(crate) prompt: String,
    pub(crate) attachments: Vec<Attachment>,
    /// A JSON object.
    pub(crate) metadata: Value,
}

/// Why a body is not a payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PayloadError {
    /// No text and no attachments: answered `422 invalid request payload`.
    #[error("missing prompt: set \"prompt\" (or \"text\", \"message\", \"input\", \"content.text\") or attach files")]
    MissingPrompt,
    /// A field of the wrong shape: answered `400` with the message.
    #[error("{0}")]
    Invalid(String),
}

impl Payload {
    /// Normalises `body` (a JSON object).
    ///
    /// # Errors
    /// [`PayloadError::MissingPrompt`] without text and attachments;
    /// [`PayloadError::Invalid`] for too many attachments or metadata that is
    /// not an object.
    pub(crate) fn from_body(body: &Value) -> Result<Payload, PayloadError> {
        let text = text_of(body);
        let attachments = attachments_of(body).map_err(PayloadError::Invalid)?;
        if text.is_none() && attachments.is_empty() {
            return Err(PayloadError::MissingPrompt);
        }
        let mut prompt = text.unwrap_or_default().to_owned();
        if !attachments.is_empty() {
            if !prompt.is_empty() {
                prompt.push_str("\n\n");
            }
            prompt.push_str("Attachments:");
            for attachment in &attachments {
                prompt.push('\n');
                prompt.push_str(&attachment.line());
            }
        }
        let metadata = metadata_of(body).map_err(PayloadError::Invalid)?;
        Ok(Payload { prompt, attachments, metadata })
    }

    /// The attachments as a JSON list.
    pub(crate) fn attachments_json(&self) -> Value {
        Value::Array(self.attachments.iter().map(Attachment::to_json).collect())
    }
}

/// The first non-blank text field.
fn text_of(body: &Value) -> Option<&str> {
    first_string(body, &TEXT_KEYS).or_else(|| {
        ["body", "content"].iter().find_map(|outer| {
            nested_string(body, outer, "text")
                .or_else(|| first_string(body, &[format!("{outer}.text").as_str()]))
        })
    })
}

fn attachments_of(body: &Value) -> Result<Vec<Attachment>, String> {
    let mut found = Vec::new();
    for source in ATTACHMENT_FIELDS {
        if let Some(value) = body.get(source) {
            collect(source, value, 0, &mut found);
        }
    }
    let mut unique: Vec<Attachment> = Vec::with_capacity(found.len());
    for attachment in found {
        if !unique.contains(&attachment) {
            unique.push(attachment);
        }
        if unique.len() > MAX_ATTACHMENTS {
            return Err(format!("too many attachments: at most {MAX_ATTACHMENTS}"));
        }
    }
    Ok(unique)
}

/// Adds the attachments `value` holds to `out`.
fn collect(source: &'static str, value: &Value, depth: usize, out: &mut Vec<Attachment>) {
    // Bounds the work a hostile body can cause, not only the recursion.
    if depth > MAX_DEPTH || out.len() > MAX_ATTACHMENTS {
        return;
    }
    match value {
        Value::String(raw) => {
            let raw = raw.trim();
            if raw.is_empty() {
                return;
            }
            match serde_json::from_str::<Value>(raw) {
                Ok(inner @ (Value::Array(_) | Value::Object(_))) => {
                    collect(source, &inner, depth + 1, out);
                }
                _ if is_data_url(raw) => out.push(Attachment {
                    source,
                    url: None,
                    name: None,
                    content_type: None,
                    size: None,
                    data: Some(raw.to_owned()),
                }),
                _ => out.push(Attachment {
                    source,
                    url: Some(raw.to_owned()),
                    name: None,
                    content_type: None,
                    size: None,
                    data: None,
                }),
            }
        }
        Value::Array(items) => {
            for item in items {
                collect(source, item, depth + 1, out);
            }
        }
        Value::Object(fields) => {
            let text = |keys: &[&str]| first_string(value, keys);
            let url = text(&["url", "href", "uri"]).map(str::to_owned);
            let (url, data_url) = match url {
                Some(url) if is_data_url(&url) => (None, Some(url)),
                url => (url, None),
            };
            let attachment = Attachment {
                source,
                url,
                name: text(&["name", "filename", "file_name", "title"]).map(str::to_owned),
                content_type: text(&["content_type", "mime_type", "type"]).map(str::to_owned),
                size: ["size", "bytes"].iter().find_map(|key| size_of(fields.get(*key)?)),
                data: text(&["data", "content_base64", "base64", "file_data"])
                    .map(str::to_owned)
                    .or(data_url),
            };
            if attachment.url.is_some() || attachment.name.is_some() || attachment.data.is_some() {
                out.push(attachment);
            } else if attachment.content_type.is_none() && attachment.size.is_none() {
                // A wrapper (`{"file": {...}}`, `{"0": "https://..."}`): look inside.
                for inner in fields.values() {
                    collect(source, inner, depth + 1, out);
                }
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Whether `text` is a `data:` URL: content, not a link.
fn is_data_url(text: &str) -> bool {
    text.trim().get(..5).is_some_and(|scheme| scheme.eq_ignore_ascii_case("data:"))
}

fn size_of(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn metadata_of(body: &Value) -> Result<Value, String> {
    match body.get("metadata") {
        None | Some(Value::Null) => Ok(Value::Object(Map::new())),
        Some(meta @ Value::Object(_)) => Ok(meta.clone()),
        Some(Value::String(raw)) if raw.trim().is_empty() => Ok(Value::Object(Map::new())),
        Some(Value::String(raw)) => match serde_json::from_str::<Value>(raw) {
            Ok(meta @ Value::Object(_)) => Ok(meta),
            _ => Err("metadata must be an object (or a string holding a JSON object)".to_owned()),
        },
        Some(_) => Err("metadata must be an object (or a string holding a JSON object)".to_owned()),
    }
}
