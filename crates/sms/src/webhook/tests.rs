//! The webhook's checks in process: the URL signed is the public URL with the
//! raw query, only the body's parameters are signed, and the answer is TwiML.

use axum::body::Body;
use axum::http::Request;
use lemon_core::sms::{ListFilter, SmsInbox};
use lemon_core::store::StoreHandle;
use tower::ServiceExt;

use super::*;
use crate::signature::sign_form;

const TOKEN: &str = "unit-auth-token";
const PUBLIC: &str = "https://hooks.example.test";

fn state(validate: bool) -> HookState {
    let text =
        format!("public_url = \"{PUBLIC}\"\nvalidate_webhook = {validate}\nmax_body_bytes = 2048");
    let config = SmsConfig::parse(&text.parse().unwrap()).unwrap();
    HookState {
        config: Arc::new(config),
        auth_token: Some(TOKEN.into()),
        inbox: Arc::new(StoreInbox::new(StoreHandle::memory(), None, 60_000)),
        replies: None,
        access: Arc::new(Access::new("sms", false)),
        tracker: TaskTracker::new(),
    }
}

fn params(sid: &str) -> Vec<(String, String)> {
    [("MessageSid", sid), ("From", "+15550001111"), ("To", "+15551239999"), ("Body", "code 2468")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

async fn post(
    state: &HookState,
    uri: &str,
    form: &[(String, String)],
    signature: Option<String>,
) -> (StatusCode, String) {
    let mut request =
        Request::post(uri).header("content-type", "application/x-www-form-urlencoded");
    if let Some(signature) = signature {
        request = request.header(SIGNATURE_HEADER, signature);
    }
    let body = serde_urlencoded::to_string(form).unwrap();
    let response =
        router(state.clone()).oneshot(request.body(Body::from(body)).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn stored(state: &HookState) -> usize {
    let all = ListFilter { include_claimed: true, ..ListFilter::default() };
    state.inbox.list_messages(all).await.unwrap().len()
}

#[tokio::test]
async fn the_signature_covers_the_public_url_the_raw_query_and_the_body_only() {
    let state = state(true);
    let form = params("SM1");
    let url = format!("{PUBLIC}{WEBHOOK_PATH}?a=1&b=%20x");
    let (status, body) = post(
        &state,
        &format!("{WEBHOOK_PATH}?a=1&b=%20x"),
        &form,
        Some(sign_form(TOKEN, &url, &form)),
    )
    .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, EMPTY_TWIML));
    // Query parameters signed as if they were form parameters do not count.
    let mut with_query = form.clone();
    with_query[0].1 = "SM2".into();
    let mut as_params = with_query.clone();
    as_params.push(("a".into(), "1".into()));
    let wrong = sign_form(TOKEN, &format!("{PUBLIC}{WEBHOOK_PATH}?a=1"), &as_params);
    let (status, _) = post(&state, &format!("{WEBHOOK_PATH}?a=1"), &with_query, Some(wrong)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(stored(&state).await, 1);
}

#[tokio::test]
async fn without_validation_unsigned_messages_are_stored_and_other_routes_are_json_errors() {
    let state = state(false);
    let (status, body) = post(&state, WEBHOOK_PATH, &params("SM9"), None).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, EMPTY_TWIML));
    assert_eq!(stored(&state).await, 1);
    let (status, body) = post(&state, "/webhooks/twilio/other", &params("SM8"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("\"error\""), "{body}");
    let get = Request::get(WEBHOOK_PATH).body(Body::empty()).unwrap();
    let response = router(state.clone()).oneshot(get).await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let big = vec![("Body".to_owned(), "x".repeat(4096))];
    let (status, body) = post(&state, WEBHOOK_PATH, &big, None).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(body.contains("2048 bytes"), "{body}");
    assert_eq!(stored(&state).await, 1);
}
