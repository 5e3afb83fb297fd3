//! Twilio's answers classified for the outbox, long answers split, and one
//! create against a local stand-in for the REST API.

use std::sync::{Arc, Mutex};

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

use super::*;

fn sink() -> TwilioSink {
    TwilioSink {
        client: TwilioClient::new("http://127.0.0.1:9", "AC1".into(), "t".into(), "+1555".into()),
    }
}

fn status(code: u16, retry_after: Option<Duration>) -> SendError {
    SendError::Status { status: code, message: "x".into(), retry_after }
}

#[test]
fn rate_limits_wait_server_errors_retry_and_refusals_fail() {
    let sink = sink();
    assert_eq!(
        sink.classify(&status(429, Some(Duration::from_secs(3)))),
        Failure::RetryAfter(Duration::from_secs(3))
    );
    assert_eq!(sink.classify(&status(429, None)), Failure::RetryAfter(DEFAULT_RETRY_AFTER));
    assert_eq!(sink.classify(&status(500, None)), Failure::Transient);
    assert_eq!(sink.classify(&status(503, None)), Failure::Transient);
    assert_eq!(sink.classify(&SendError::Network("reset".into())), Failure::Transient);
    assert_eq!(sink.classify(&status(400, None)), Failure::Fatal);
    assert_eq!(sink.classify(&status(401, None)), Failure::Fatal);
    assert_eq!(sink.classify(&SendError::Protocol("html".into())), Failure::Fatal);
}

#[test]
fn long_answers_are_split_into_messages_twilio_accepts() {
    assert_eq!(split_body("  short  "), ["short"]);
    assert!(split_body("   ").is_empty());
    let words = "lemon ".repeat(700);
    let parts = split_body(&words);
    assert_eq!(parts.len(), 3);
    assert!(parts.iter().all(|p| p.chars().count() <= MAX_BODY_CHARS && !p.starts_with(' ')));
    assert_eq!(parts.join(" "), words.trim());
    // No whitespace at all: cut at the limit, by characters.
    let unbroken = "é".repeat(MAX_BODY_CHARS + 5);
    let parts = split_body(&unbroken);
    assert_eq!(parts.iter().map(|p| p.chars().count()).collect::<Vec<_>>(), [MAX_BODY_CHARS, 5]);
}

type Seen = Arc<Mutex<Vec<(String, Option<String>, String)>>>;

async fn stand_in(answer: (StatusCode, &'static str, Option<&'static str>)) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/2010-04-01/Accounts/{sid}/Messages.json",
        post(move |Path(sid): Path<String>, headers: HeaderMap, body: String| {
            let record = record.clone();
            async move {
                let auth = headers.get("authorization").map(|v| v.to_str().unwrap().to_owned());
                record.lock().unwrap().push((sid, auth, body));
                let mut response = (answer.0, answer.1).into_response();
                if let Some(after) = answer.2 {
                    response.headers_mut().insert("retry-after", after.parse().unwrap());
                }
                response
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

use axum::response::IntoResponse;

#[tokio::test]
async fn a_create_posts_the_form_with_basic_auth_and_reads_the_sid() {
    let created = r#"{"sid": "SM123", "status": "queued", "to": "+15550001111"}"#;
    let (url, seen) = stand_in((StatusCode::CREATED, created, None)).await;
    let client =
        TwilioClient::new(&url, "AC9".into(), "secret-token".into(), "+15551239999".into());
    let sms = OutboundSms { to: "+15550001111".into(), body: "Hi & bye".into() };
    let sent = client.create(&sms).await.unwrap();
    assert_eq!(sent, SentSms { sid: "SM123".into(), status: "queued".into() });
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (sid, auth, body) = &seen[0];
    assert_eq!(sid, "AC9");
    // base64("AC9:secret-token")
    assert_eq!(auth.as_deref(), Some("Basic QUM5OnNlY3JldC10b2tlbg=="));
    assert_eq!(body, "To=%2B15550001111&From=%2B15551239999&Body=Hi+%26+bye");
}

#[tokio::test]
async fn an_error_carries_twilios_message_and_retry_after_but_no_secret() {
    let error = r#"{"code": 20429, "message": "Too Many Requests", "more_info": "https://www.twilio.com/docs/errors/20429", "status": 429}"#;
    let (url, _) = stand_in((StatusCode::TOO_MANY_REQUESTS, error, Some("7"))).await;
    let client =
        TwilioClient::new(&url, "AC9".into(), "secret-token".into(), "+15551239999".into());
    let sms = OutboundSms { to: "+15550001111".into(), body: "Hi".into() };
    let failed = client.create(&sms).await.unwrap_err();
    assert_eq!(
        failed,
        SendError::Status {
            status: 429,
            message: "Too Many Requests (code 20429)".into(),
            retry_after: Some(Duration::from_secs(7)),
        }
    );
    let (url, _) = stand_in((StatusCode::BAD_GATEWAY, "<html>bad gateway</html>", None)).await;
    let client =
        TwilioClient::new(&url, "AC9".into(), "secret-token".into(), "+15551239999".into());
    let failed = client.create(&sms).await.unwrap_err().to_string();
    assert_eq!(failed, "Twilio answered 502: Bad Gateway");
    let unreachable =
        TwilioClient::new("http://127.0.0.1:1", "AC9".into(), "secret-token".into(), "+1".into());
    let failed = unreachable.create(&sms).await.unwrap_err().to_string();
    assert!(!failed.contains("AC9") && !failed.contains("secret-token"), "{failed}");
}

/// A stand-in whose first create is taken (recorded) but answered only after
/// `hold`, as a Twilio that made the message and then went quiet.
async fn slow_first(hold: Duration) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/2010-04-01/Accounts/{sid}/Messages.json",
        post(move |body: String| {
            let record = record.clone();
            async move {
                let n = {
                    let mut seen = record.lock().unwrap();
                    seen.push(body);
                    seen.len()
                };
                if n == 1 {
                    tokio::time::sleep(hold).await;
                }
                let created = format!(r#"{{"sid": "SM{n}", "status": "queued"}}"#);
                (StatusCode::CREATED, created).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

#[tokio::test]
async fn a_create_that_outlasts_the_timeout_is_sent_again_erring_on_a_duplicate() {
    let (url, seen) = slow_first(Duration::from_secs(30)).await;
    let client = TwilioClient::new(&url, "AC9".into(), "t".into(), "+15551239999".into())
        .with_timeout(Duration::from_millis(300));
    let sms = OutboundSms { to: "+15550001111".into(), body: "Hi".into() };
    let failed = client.create(&sms).await.unwrap_err();
    assert!(matches!(failed, SendError::Network(_)), "{failed:?}");
    assert_eq!(sink().classify(&failed), Failure::Transient);

    assert_eq!(seen.lock().unwrap().len(), 1);

    // Through the sender: the timed-out create is made again, and Twilio,
    // which has no idempotency key, takes both.
    let (url, seen) = slow_first(Duration::from_secs(30)).await;
    let client = TwilioClient::new(&url, "AC9".into(), "t".into(), "+15551239999".into())
        .with_timeout(Duration::from_millis(300));
    let tracker = TaskTracker::new();
    let token = CancellationToken::new();
    let sender =
        SmsSender::spawn(client, StoreHandle::memory(), Duration::from_secs(60), token, &tracker);
    let sent = sender.send("+15550001111", "Hi", None).await.unwrap();
    assert_eq!(sent.sid, "SM2");
    assert_eq!(seen.lock().unwrap().len(), 2, "sent twice: once timed out, once answered");
    assert_eq!(sender.backlog().calls().n_retried, 1);
}
