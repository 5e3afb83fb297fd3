//! Tests of the secrets routes over a store without a keychain.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use lemon_core::secrets::SecretStore;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tower::ServiceExt;

use super::{routes, SecretUse, SecretUses, SecretsApi};

fn api(dir: &std::path::Path, env: &[(&str, &str)]) -> SecretsApi {
    let env: BTreeMap<String, String> =
        env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let uses = vec![
        SecretUse {
            name: "telegram_bot_token".into(),
            used_by: vec!["telegram".into()],
            inline: false,
        },
        SecretUse {
            name: "openai_api_key".into(),
            used_by: vec!["engines.lemon".into()],
            inline: false,
        },
        SecretUse {
            name: "gateway.webhook.integrations.a.token".into(),
            used_by: vec!["webhook.a".into()],
            inline: true,
        },
    ];
    SecretsApi {
        store: Arc::new(SecretStore::new(env, dir.join("secrets.toml"))),
        uses: SecretUses::new(uses),
        changed: Arc::new(Notify::new()),
    }
}

async fn call(
    api: &SecretsApi,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, String) {
    let mut request = Request::builder().method(method).uri(path);
    let body = match body {
        Some(body) => {
            request = request.header(header::CONTENT_TYPE, "application/json");
            Body::from(body.to_string())
        }
        None => Body::empty(),
    };
    let response = routes(api.clone()).oneshot(request.body(body).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn list_set_and_delete_without_ever_showing_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let api = api(dir.path(), &[("OPENAI_API_KEY", "sk-from-env")]);
    let (status, body) = call(&api, Method::GET, "/v1/secrets", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        listed["secrets"],
        json!([
            {"name": "gateway.webhook.integrations.a.token", "source": "inline", "used_by": ["webhook.a"]},
            {"name": "openai_api_key", "source": "env", "used_by": ["engines.lemon"]},
            {"name": "telegram_bot_token", "source": null, "used_by": ["telegram"]},
        ])
    );
    assert_eq!(listed["keychain"]["available"], json!(false));

    let notified = api.changed.clone();
    let waiter = tokio::spawn(async move { notified.notified().await });
    let (status, body) = call(
        &api,
        Method::PUT,
        "/v1/secrets/telegram_bot_token",
        Some(json!({"value": "123:the-secret-value"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"name": "telegram_bot_token", "source": "file"})
    );
    lemon_core::testing::within("the change notice", waiter).await.unwrap();
    let stored = api.store.get("telegram_bot_token").unwrap().unwrap();
    assert_eq!(stored.expose(), "123:the-secret-value");

    let (_, body) = call(&api, Method::GET, "/v1/secrets", None).await;
    assert!(
        body.contains(r#"{"name":"telegram_bot_token","source":"file","used_by":["telegram"]}"#),
        "{body}"
    );
    assert!(!body.contains("the-secret-value"), "{body}");

    let (status, body) = call(&api, Method::DELETE, "/v1/secrets/telegram_bot_token", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"name": "telegram_bot_token", "deleted": true})
    );
    assert!(api.store.get("telegram_bot_token").unwrap().is_none());
    let (status, body) = call(&api, Method::DELETE, "/v1/secrets/telegram_bot_token", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = call(&api, Method::DELETE, "/v1/secrets/openai_api_key", None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("OPENAI_API_KEY") && !body.contains("sk-from-env"), "{body}");
}

#[tokio::test]
async fn bad_names_and_bodies_are_refused_without_echoing_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let api = api(dir.path(), &[]);
    for name in ["Upper", "with-dash", "dot.name", &"x".repeat(65)] {
        let path = format!("/v1/secrets/{name}");
        let (status, body) = call(&api, Method::PUT, &path, Some(json!({"value": "v-1234"}))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {body}");
        assert!(body.contains("invalid secret name") && !body.contains("v-1234"), "{body}");
    }
    for bad in
        [json!({}), json!({"value": 5}), json!({"value": "x", "other": 1}), json!({"value": "  "})]
    {
        let (status, body) =
            call(&api, Method::PUT, "/v1/secrets/ok_name", Some(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body.starts_with("{\"error\":"), "{body}");
    }
    let long = "v".repeat(super::MAX_VALUE_BYTES + 1);
    let (status, body) =
        call(&api, Method::PUT, "/v1/secrets/ok_name", Some(json!({"value": long}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.len() < 200, "the value is not echoed");
    assert!(api.store.get("ok_name").unwrap().is_none());
}
