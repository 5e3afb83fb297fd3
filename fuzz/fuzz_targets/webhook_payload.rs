//! Webhook normalisation: a request's raw body read as the webhook reads it
//! (JSON object, then text, attachments and metadata), and the decoding of its
//! query's names and values.
//!
//! Input: a query line, then the body.
//! Properties: an accepted body has a non-blank prompt, at most the allowed
//! attachments, each listed in the prompt (by its URL and name; one that
//! carries only content as a file without a name, its content never), and an
//! object of metadata; percent-encoding any text decodes back to it.
#![no_main]

use lemon_transports::fuzzing::{webhook_body, webhook_query_part, WEBHOOK_MAX_ATTACHMENTS};
use libfuzzer_sys::fuzz_target;

/// `text` with every byte outside `[A-Za-z0-9_.~-]` as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let (query, body) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&data[..0], data),
    };
    let query = String::from_utf8_lossy(query);
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((&pair, ""));
        let _ = webhook_query_part(name);
        let _ = webhook_query_part(value);
    }
    assert_eq!(webhook_query_part(&percent_encode(&query)).as_deref(), Some(&*query));

    let Ok(accepted) = webhook_body(body) else { return };
    assert!(!accepted.prompt.trim().is_empty(), "blank prompt");
    assert!(accepted.metadata.is_object(), "metadata not an object");
    let attachments = accepted.attachments.as_array().expect("a list of attachments");
    assert!(attachments.len() <= WEBHOOK_MAX_ATTACHMENTS, "{} attachments", attachments.len());
    if !attachments.is_empty() {
        assert!(accepted.prompt.contains("Attachments:"), "attachments not in the prompt");
    }
    for attachment in attachments {
        let url = attachment.get("url").and_then(|v| v.as_str());
        let name = attachment.get("name").and_then(|v| v.as_str());
        let line = match (name, url) {
            (Some(name), Some(url)) => format!("- {name} ({url})"),
            (None, Some(url)) => format!("- {url}"),
            (Some(name), None) => format!("- {name}"),
            // Content alone (base64, a `data:` URL): never written in the prompt.
            (None, None) => "- (a file without a name)".to_owned(),
        };
        assert!(accepted.prompt.contains(&line), "attachment line {line:?} not in the prompt");
    }
});
