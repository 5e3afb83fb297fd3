//! Twilio's SMS webhook: the form body parsed as the webhook parses it, its
//! signature made and checked (`lemon_sms::signature`), the message stored by
//! the inbox (`StoreInbox::ingest`) on an in-memory store.
//!
//! Input: the auth token, the URL Twilio called, each on a line, then the body.
//! Properties: a signature is valid for what it signed, whatever the order of
//! the parameters and with the default port written or not; it is not valid
//! for another token, URL or parameters, nor once altered; a JSON body's hash
//! signature holds for that body only; a stored message has the form's
//! trimmed body and codes that are 4–8 digit runs of it, and a second
//! delivery of the same sid is a duplicate.
#![no_main]

use std::sync::OnceLock;

use lemon_core::sms::SmsMessage;
use lemon_core::store::StoreHandle;
use lemon_sms::inbox::{Ingested, StoreInbox};
use lemon_sms::signature::{body_sha256, sign_form, validate_body, validate_form};
use libfuzzer_sys::fuzz_target;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime")
    })
}

/// `url` with `:443` / `:80` after the host when it has no port.
fn with_default_port(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let port = match scheme {
        "https" => "443",
        "http" => "80",
        _ => return None,
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    if authority.is_empty() || authority.contains([':', '@', '[']) {
        return None;
    }
    Some(format!("{scheme}://{authority}:{port}{tail}"))
}

fn check_stored(params: &[(String, String)], message: &SmsMessage) {
    let body = params.iter().find(|(k, _)| k == "Body").map_or("", |(_, v)| v.as_str());
    assert_eq!(message.body, body.trim());
    for code in &message.codes {
        assert!((4..=8).contains(&code.len()), "code {code:?}");
        assert!(code.bytes().all(|b| b.is_ascii_digit()), "code {code:?}");
        assert!(message.body.contains(code.as_str()), "code {code:?} not in the body");
    }
    assert!(!message.message_sid.is_empty());
    assert!(message.message_sid.bytes().all(|b| b.is_ascii_alphanumeric()));
    assert!(!message.from.is_empty() && !message.to.is_empty());
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == b'\n');
    let (Some(token), Some(url), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let token = String::from_utf8_lossy(token);
    let url = String::from_utf8_lossy(url);

    // The JSON flavour: the hash in the URL, the signature over the URL alone.
    if !url.contains(['?', '#']) {
        let hashed = format!("{url}?bodySHA256={}", body_sha256(body));
        let signature = sign_form(&token, &hashed, &[]);
        assert_eq!(validate_body(&token, &hashed, body, &signature), !token.is_empty());
        let mut other = body.to_vec();
        other.push(b'x');
        assert!(!validate_body(&token, &hashed, &other, &signature), "a hash for another body");
    }

    let Ok(params) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(body) else { return };
    let signature = sign_form(&token, &url, &params);
    assert_eq!(validate_form(&token, &url, &params, &signature), !token.is_empty());
    if !token.is_empty() {
        let mut reversed = params.clone();
        reversed.reverse();
        assert!(validate_form(&token, &url, &reversed, &signature), "order changed the signature");
        if let Some(ported) = with_default_port(&url) {
            assert!(validate_form(&token, &ported, &params, &signature), "{ported} refused");
            let signed_ported = sign_form(&token, &ported, &params);
            assert!(validate_form(&token, &url, &params, &signed_ported), "{url} refused");
        }
        assert!(!validate_form(&format!("{token}x"), &url, &params, &signature), "another token");
        assert!(!validate_form(&token, &format!("{url}x"), &params, &signature), "another URL");
        let mut more = params.clone();
        more.push(("Extra".to_owned(), "1".to_owned()));
        assert!(!validate_form(&token, &url, &more, &signature), "another parameter");
        let mut altered = signature.clone().into_bytes();
        altered[0] = if altered[0] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).expect("base64 is ASCII");
        assert!(!validate_form(&token, &url, &params, &altered), "an altered signature");
    }

    runtime().block_on(async {
        let inbox = StoreInbox::with_clock(
            StoreHandle::memory(),
            Some("+15550001111".to_owned()),
            60_000,
            std::sync::Arc::new(|| 1_700_000_000_000),
        );
        match inbox.ingest(&params).await {
            Ok(Ingested::Stored(message)) => {
                check_stored(&params, &message);
                let again = inbox.ingest(&params).await;
                assert!(matches!(again, Ok(Ingested::Duplicate)), "a second delivery: {again:?}");
            }
            Ok(Ingested::Duplicate) => panic!("a duplicate in an empty inbox"),
            Err(_) => {}
        }
    });
});
