//! The error mapping and update decoding, without a network.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use super::{decode_update, interpret, BotApi};
use crate::telegram::types::TelegramError;

const TOKEN: &str = "123456:AAE-secret_token";

fn check(status: u16, body: &str, expected: Result<serde_json::Value, TelegramError>) {
    let status = StatusCode::from_u16(status).unwrap();
    assert_eq!(interpret(status, body.as_bytes()), expected, "status {status}, body {body}");
}

fn error_body(code: u16, description: &str, parameters: serde_json::Value) -> String {
    json!({"ok": false, "error_code": code, "description": description, "parameters": parameters})
        .to_string()
}

#[test]
fn an_ok_answer_gives_its_result() {
    check(200, r#"{"ok":true,"result":{"id":1}}"#, Ok(json!({"id": 1})));
    check(200, r#"{"ok":true,"result":true}"#, Ok(json!(true)));
}

#[test]
fn an_ok_answer_without_result_or_with_an_error_status_is_a_network_error() {
    assert!(matches!(interpret(StatusCode::OK, br#"{"ok":true}"#), Err(TelegramError::Network(_))));
    assert!(matches!(
        interpret(StatusCode::BAD_GATEWAY, br#"{"ok":true,"result":1}"#),
        Err(TelegramError::Network(_))
    ));
}

#[test]
fn too_many_requests_waits_retry_after_seconds_or_one() {
    check(
        429,
        &error_body(429, "Too Many Requests: retry after 7", json!({"retry_after": 7})),
        Err(TelegramError::RetryAfter(Duration::from_secs(7))),
    );
    check(
        429,
        r#"{"ok":false,"error_code":429,"description":"Too Many Requests"}"#,
        Err(TelegramError::RetryAfter(Duration::from_secs(1))),
    );
}

#[test]
fn bad_requests_are_told_apart_by_description_and_parameters() {
    check(
        400,
        &error_body(
            400,
            "Bad Request: message is not modified: specified new message content and reply markup are exactly the same",
            json!({}),
        ),
        Err(TelegramError::NotModified),
    );
    check(
        400,
        &error_body(
            400,
            "Bad Request: group chat was upgraded to a supergroup chat",
            json!({"migrate_to_chat_id": -1001234}),
        ),
        Err(TelegramError::MigratedTo(-1001234)),
    );
    check(
        400,
        &error_body(400, "Bad Request: message is too long", json!({})),
        Err(TelegramError::Rejected {
            code: 400,
            description: "Bad Request: message is too long".into(),
        }),
    );
    check(
        403,
        &error_body(403, "Forbidden: bot was blocked by the user", json!({})),
        Err(TelegramError::Rejected {
            code: 403,
            description: "Forbidden: bot was blocked by the user".into(),
        }),
    );
}

#[test]
fn wrong_tokens_and_conflicts_have_their_own_errors() {
    check(
        401,
        &error_body(401, "Unauthorized", json!({})),
        Err(TelegramError::Unauthorized { description: "Unauthorized".into() }),
    );
    check(
        404,
        &error_body(404, "Not Found", json!({})),
        Err(TelegramError::Unauthorized { description: "Not Found".into() }),
    );
    check(
        409,
        &error_body(409, "Conflict: terminated by other getUpdates request", json!({})),
        Err(TelegramError::Conflict {
            description: "Conflict: terminated by other getUpdates request".into(),
        }),
    );
}

#[test]
fn server_errors_are_retryable_even_without_json() {
    check(
        500,
        &error_body(500, "Internal Server Error", json!({})),
        Err(TelegramError::Server { code: 500, description: "Internal Server Error".into() }),
    );
    let html = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n</html>";
    let error = interpret(StatusCode::BAD_GATEWAY, html.as_bytes()).unwrap_err();
    assert_eq!(
        error,
        TelegramError::Server {
            code: 502,
            description: "<html> <head><title>502 Bad Gateway</title></head> </html>".into()
        }
    );
    assert!(error.is_retryable());
    check(
        503,
        "",
        Err(TelegramError::Server { code: 503, description: "Service Unavailable".into() }),
    );
}

#[test]
fn a_success_status_with_a_body_that_is_not_json_is_a_network_error() {
    assert!(matches!(
        interpret(StatusCode::OK, b"<html>captive portal</html>"),
        Err(TelegramError::Network(_))
    ));
}

#[test]
fn an_update_with_a_broken_message_keeps_its_id() {
    let update = decode_update(json!({
        "update_id": 41,
        "message": {"message_id": "not a number", "chat": {"id": 1, "type": "private"}}
    }))
    .unwrap();
    assert_eq!(update.update_id, 41);
    assert_eq!(update.message, None);
}

#[test]
fn an_update_keeps_the_fields_that_parse() {
    let update = decode_update(json!({
        "update_id": 42,
        "message": {"message_id": 5, "chat": {"id": 1, "type": "private"}, "text": "hi"},
        "edited_message": {"chat": null}
    }))
    .unwrap();
    assert_eq!(update.message.unwrap().text.as_deref(), Some("hi"));
    assert_eq!(update.edited_message, None);
}

#[test]
fn updates_of_other_kinds_and_entries_without_an_id() {
    let update = decode_update(json!({"update_id": 43, "callback_query": {"id": "x"}})).unwrap();
    assert_eq!((update.update_id, update.message), (43, None));
    assert_eq!(decode_update(json!({"message": {}})), None);
    assert_eq!(decode_update(json!("garbage")), None);
}

#[test]
fn tokens_that_would_change_the_url_are_refused() {
    for token in ["", "123/../x", "12 34", "abc?x=1", "tok#en"] {
        assert!(
            matches!(
                BotApi::new("http://127.0.0.1:1", token),
                Err(TelegramError::Unauthorized { .. })
            ),
            "{token:?}"
        );
    }
}

#[test]
fn base_urls_must_be_plain_http_or_https() {
    for base in ["", "api.telegram.org", "ftp://api.telegram.org", "http://h/?q=1", "http://h/#f"] {
        assert!(
            matches!(BotApi::new(base, TOKEN), Err(TelegramError::InvalidBaseUrl(_))),
            "{base:?}"
        );
    }
    assert!(BotApi::new("https://api.telegram.org/", TOKEN).is_ok());
    assert!(BotApi::new("http://127.0.0.1:8081/prefix", TOKEN).is_ok());
}

#[test]
fn debug_output_redacts_the_token() {
    let api = BotApi::new("http://127.0.0.1:1", TOKEN).unwrap();
    let shown = format!("{api:?}");
    assert!(!shown.contains(TOKEN), "{shown}");
    assert!(!shown.contains("AAE-secret_token"), "{shown}");
    assert!(shown.contains("<redacted>") && shown.contains("http://127.0.0.1:1"), "{shown}");
}

#[test]
fn error_text_is_scrubbed_of_the_token() {
    let api = BotApi::new("http://127.0.0.1:1", TOKEN).unwrap();
    let error = api.scrub_error(TelegramError::Rejected {
        code: 400,
        description: format!("Bad Request: bot{TOKEN} said no"),
    });
    assert_eq!(
        error,
        TelegramError::Rejected {
            code: 400,
            description: "Bad Request: bot<redacted> said no".into()
        }
    );
}

#[tokio::test]
async fn https_base_urls_reach_the_network() {
    // Nothing listens on port 1: the call must fail while connecting, not because
    // the client cannot speak TLS.
    let api = BotApi::new("https://127.0.0.1:1", TOKEN).unwrap();
    let error = api.get_me().await.unwrap_err();
    let TelegramError::Network(text) = &error else { panic!("{error:?}") };
    assert!(text.contains("connect") && !text.contains("scheme"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
}

#[test]
fn a_file_url_holds_the_token_only_where_the_request_needs_it() {
    use crate::telegram::types::FileInfo;
    let api = BotApi::new("http://127.0.0.1:9/prefix/", TOKEN).unwrap();
    let info = |path: Option<&str>| FileInfo {
        file_id: "f".into(),
        file_size: None,
        file_path: path.map(str::to_owned),
    };
    let url = api.file_url(&info(Some("documents/file_7.pdf"))).unwrap();
    assert_eq!(
        url.expose(),
        format!("http://127.0.0.1:9/prefix/file/bot{TOKEN}/documents/file_7.pdf")
    );
    assert!(!format!("{url:?}").contains(TOKEN), "Debug is redacted");
    for bad in
        [None, Some(""), Some("/etc/passwd"), Some("a/../../b"), Some("a?x=1"), Some("a/%2e%2e")]
    {
        let error = api.file_url(&info(bad)).unwrap_err();
        assert!(!error.to_string().contains(TOKEN), "{error}");
        assert!(matches!(error, TelegramError::Rejected { .. }), "{bad:?}: {error}");
    }
}
