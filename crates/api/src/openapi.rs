//! The control API's OpenAPI 3.1 document, served at `GET /v1/openapi.json`.
//!
//! Each handler carries its `#[utoipa::path]` (method, path, parameters,
//! body and every status it answers); request bodies, query strings and
//! response bodies are the types the handlers read and write, their doc
//! comments the descriptions ([`schema`] holds the few shapes with no type
//! of their own). [`markdown`] renders the book's reference page from the
//! document. [`document`] holds the API's own routes (runs,
//! sessions, cron, config, the OpenAI-compatible routes, secrets); the
//! components that merge routes in (SMS, calls) give their own document, and
//! the server merges them with [`merge`] into the one it serves, so the
//! document lists exactly the routes that gateway answers.
//!
//! The document describes the API and holds nothing of the gateway's state,
//! but it is served behind the same bearer token as the rest: a port scanner
//! learns nothing about what answers there.

#[cfg(any(test, feature = "test-util"))]
pub mod conformance;
pub mod markdown;
pub mod schema;

use std::collections::BTreeMap;

use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, RefOr};
use utoipa::{IntoResponses, OpenApi, PartialSchema};

use crate::api::openai::error::OpenAiErrorBody;

/// The name of the bearer-token security scheme every operation requires.
pub const SECURITY_SCHEME: &str = "bearer";

/// The control API's own routes (without the components').
pub fn document() -> Document {
    let mut doc = crate::api::ApiDoc::openapi();
    doc.merge(crate::api::openai_doc());
    doc.merge(crate::secrets::SecretsDoc::openapi());
    doc.merge(MetaDoc::openapi());
    finish(doc)
}

/// `base` with the routes of `extra` (a component's document) added.
pub fn merge(mut base: Document, extra: Document) -> Document {
    base.merge(extra);
    finish(base)
}

/// Sets what every document carries: title, version, the bearer scheme and
/// the requirement of it on every operation.
fn finish(mut doc: Document) -> Document {
    doc.info.title = "Lemon Gateway control API".to_owned();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.info.description = Some(
        "Runs, sessions, cron, config, secrets and the OpenAI-compatible routes of a Lemon \
         Gateway. Every route needs `Authorization: Bearer <token>`; every error is \
         `{\"error\": \"...\"}` (the OpenAI-compatible routes: OpenAI's error object)."
            .to_owned(),
    );
    doc.info.license = None;
    doc.info.contact = None;
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        SECURITY_SCHEME,
        SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
    );
    // The types the shared refusals' bodies ([`Errors`], [`OpenAiErrors`]) point to.
    let mut shared = Vec::new();
    <OpenAiErrorBody as utoipa::ToSchema>::schemas(&mut shared);
    for (name, schema) in shared {
        components.schemas.entry(name).or_insert(schema);
    }
    doc.security = Some(vec![SecurityRequirement::new(SECURITY_SCHEME, Vec::<String>::new())]);
    unique_operation_ids(&mut doc);
    doc
}

/// Handlers of different routes share names (`list`, `get`): an operation
/// whose id another has too is named after its tag as well (`secrets_list`).
fn unique_operation_ids(doc: &mut Document) {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for item in doc.paths.paths.values() {
        for operation in
            [&item.get, &item.post, &item.put, &item.patch, &item.delete].into_iter().flatten()
        {
            if let Some(id) = &operation.operation_id {
                *seen.entry(id.clone()).or_default() += 1;
            }
        }
    }
    for item in doc.paths.paths.values_mut() {
        for operation in
            [&mut item.get, &mut item.post, &mut item.put, &mut item.patch, &mut item.delete]
                .into_iter()
                .flatten()
        {
            let Some(id) = operation.operation_id.clone() else { continue };
            if seen.get(&id).copied().unwrap_or(0) > 1 {
                let tag = operation.tags.as_ref().and_then(|t| t.first()).cloned();
                operation.operation_id = Some(format!("{}_{id}", tag.unwrap_or_default()));
            }
        }
    }
}

/// A JSON response with `description` and the schema of `T`.
fn json_response<T: PartialSchema>(description: &str) -> RefOr<Response> {
    ResponseBuilder::new()
        .description(description)
        .content("application/json", ContentBuilder::new().schema(Some(T::schema())).build())
        .build()
        .into()
}

/// The refusals every `{"error": …}` route may answer with: bad input, a
/// missing token, a body too large or not JSON, overload and shutdown.
#[derive(Debug, Clone, Copy)]
pub struct Errors;

impl IntoResponses for Errors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        use crate::error::ErrorBody as Error;
        BTreeMap::from([
            ("400".to_owned(), json_response::<Error>("The request is malformed.")),
            ("401".to_owned(), json_response::<Error>("Missing or invalid bearer token.")),
            ("413".to_owned(), json_response::<Error>("The body is larger than 1 MiB.")),
            ("415".to_owned(), json_response::<Error>("The body is not JSON.")),
            (
                "429".to_owned(),
                json_response::<Error>(
                    "Too much work is waiting, or this client sent more requests than its rate; retry after `Retry-After`.",
                ),
            ),
            ("503".to_owned(), json_response::<Error>("The gateway is shutting down.")),
        ])
    }
}

/// [`Errors`] in the OpenAI-compatible routes' error object.
#[derive(Debug, Clone, Copy)]
pub struct OpenAiErrors;

impl IntoResponses for OpenAiErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        use OpenAiErrorBody as E;
        BTreeMap::from([
            ("400".to_owned(), json_response::<E>("The request is malformed.")),
            ("401".to_owned(), json_response::<E>("Missing or invalid API key.")),
            ("404".to_owned(), json_response::<E>("No such model or response.")),
            ("413".to_owned(), json_response::<E>("The body is larger than 1 MiB.")),
            ("415".to_owned(), json_response::<E>("The body is not JSON.")),
            (
                "429".to_owned(),
                json_response::<E>("Too much work is waiting, or this client is over its rate."),
            ),
            ("503".to_owned(), json_response::<E>("The gateway is shutting down.")),
        ])
    }
}

/// `GET /v1/openapi.json`: this OpenAPI document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "meta",
    responses(
        (status = 200, description = "This OpenAPI 3.1 document.", body = Object),
        Errors,
    )
)]
pub(crate) async fn served(
    axum::extract::State(doc): axum::extract::State<axum::body::Bytes>,
) -> impl axum::response::IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], doc)
}

#[derive(OpenApi)]
#[openapi(paths(served))]
pub(crate) struct MetaDoc;

#[cfg(any(test, feature = "test-util"))]
pub mod routes;
