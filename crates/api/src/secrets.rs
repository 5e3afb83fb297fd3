//! `/v1/secrets`: which secrets there are, where each is kept and what uses
//! it; set and delete them. Values go in and are never sent back, logged or
//! put in an error.
//!
//! | method | path | success |
//! | --- | --- | --- |
//! | `GET` | `/v1/secrets` | `200 {"secrets": [{"name", "source", "used_by"}], "keychain": {"available", "detail"}}` |
//! | `PUT` | `/v1/secrets/{name}` body `{"value"}` | `200 {"name", "source"}`: saved in the keychain when there is one, else the secrets file |
//! | `DELETE` | `/v1/secrets/{name}` | `200 {"name", "deleted": true}` |
//!
//! `source` is `keychain`, `env`, `file` or `inline` (written into
//! config.toml; such an entry's name is its key there), or `null` for a secret
//! the config names that no source has. Names are `[a-z0-9_]{1,64}`. The
//! routes are merged into the control API ([`crate::api::router_with`]), behind
//! its bearer token. A change is announced on [`SecretsApi::changed`], so the
//! components using the secret take the new value without a restart.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use lemon_core::secrets::{check_settable_name, SecretStore, SecretsError, SourceKind};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;

use crate::error::{ApiError, ErrorBody, JsonBody, PathParams};
use crate::openapi::Errors;

/// `GET /v1/secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Secrets {
    /// Whether the OS keychain can be used.
    pub keychain: Keychain,
    /// Every secret known (set somewhere, or named by the config), by name.
    pub secrets: Vec<SecretEntry>,
}

/// A secret in `GET /v1/secrets` (never its value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SecretEntry {
    pub name: String,
    /// `keychain`, `env`, `file`, `inline`, or `null`: not set anywhere.
    #[schema(required = true)]
    pub source: Option<String>,
    /// What in the config uses it.
    pub used_by: Vec<String>,
}

/// Whether the OS keychain can be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Keychain {
    pub available: bool,
    /// The backend in use (`Secret Service`), or why there is none.
    pub detail: String,
}

/// `PUT /v1/secrets/{name}`: where the secret was saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SecretSaved {
    pub name: String,
    /// `keychain` or `file`.
    pub source: String,
}

/// `DELETE /v1/secrets/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SecretDeleted {
    /// `true`.
    pub deleted: bool,
    pub name: String,
}

/// Longest secret value accepted, in bytes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// One secret the config uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretUse {
    /// The secret's name (`telegram_bot_token`), or for an inline value its
    /// key in config.toml (`gateway.telegram.bot_token`).
    pub name: String,
    /// What uses it: `api`, `telegram`, `engines.claude`, `webhook.zapier`.
    pub used_by: Vec<String>,
    /// Written into config.toml rather than named.
    pub inline: bool,
}

/// The secrets the config in force uses; the server replaces the list when a
/// config edit is applied.
#[derive(Debug, Clone, Default)]
pub struct SecretUses(Arc<RwLock<Vec<SecretUse>>>);

impl SecretUses {
    pub fn new(uses: Vec<SecretUse>) -> Self {
        SecretUses(Arc::new(RwLock::new(uses)))
    }

    pub fn replace(&self, uses: Vec<SecretUse>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = uses;
    }

    pub fn get(&self) -> Vec<SecretUse> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// What the secrets routes share.
#[derive(Clone)]
pub struct SecretsApi {
    pub store: Arc<SecretStore>,
    pub uses: SecretUses,
    /// Notified after every change (`PUT`, `DELETE`).
    pub changed: Arc<Notify>,
}

impl fmt::Debug for SecretsApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsApi").field("store", &self.store).finish_non_exhaustive()
    }
}

/// The routes, to merge into the control API.
pub fn routes(api: SecretsApi) -> Router {
    Router::new()
        .route("/v1/secrets", get(list))
        .route("/v1/secrets/{name}", axum::routing::put(put).delete(delete))
        .with_state(api)
}

/// One row of [`listing`]: a name, where it is kept (`None`: nowhere) and what
/// uses it.
pub type SecretRow = (String, Option<SourceKind>, Vec<String>);

/// Every name worth showing with where it is kept and what uses it: the
/// config's, then the ones stored in the keychain or the file.
///
/// # Errors
/// A source that cannot be read.
pub fn listing(store: &SecretStore, uses: &[SecretUse]) -> Result<Vec<SecretRow>, SecretsError> {
    let mut rows: BTreeMap<String, (Option<SourceKind>, Vec<String>)> = BTreeMap::new();
    for secret in uses {
        let row = rows.entry(secret.name.clone()).or_default();
        row.1.extend(secret.used_by.iter().cloned());
        if secret.inline {
            row.0 = Some(SourceKind::Inline);
        }
    }
    for name in store.stored_names()? {
        rows.entry(name).or_default();
    }
    let mut out = Vec::new();
    for (name, (inline, mut used_by)) in rows {
        let source = match inline {
            Some(kind) => Some(kind),
            None => store.kind_of(&name)?,
        };
        used_by.sort();
        used_by.dedup();
        out.push((name, source, used_by));
    }
    Ok(out)
}

/// A store error as the API reports it (names, never values).
fn store_error(error: SecretsError) -> ApiError {
    match error {
        SecretsError::InvalidName { name } => ApiError::BadRequest(format!(
            "invalid secret name {name:?}: use 1 to 64 lowercase letters, digits and `_`"
        )),
        other => ApiError::Internal(other.to_string()),
    }
}

/// Runs a store call off the async threads (a keychain call may block until
/// its timeout).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SecretsError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::Internal(format!("secret store task failed: {e}")))?
        .map_err(store_error)
}

/// The description of these routes.
#[derive(utoipa::OpenApi)]
#[openapi(paths(list, put, delete))]
pub(crate) struct SecretsDoc;

/// `GET /v1/secrets`: every secret's name, where it is kept and what uses it.
#[utoipa::path(
    get,
    path = "/v1/secrets",
    tag = "secrets",
    responses((status = 200, description = "Every secret's name, source and uses; never a value.", body = Secrets), Errors)
)]
async fn list(State(api): State<SecretsApi>) -> Result<Json<Secrets>, ApiError> {
    let store = api.store.clone();
    let uses = api.uses.get();
    let rows = blocking(move || listing(&store, &uses)).await?;
    let secrets = rows
        .into_iter()
        .map(|(name, source, used_by)| SecretEntry {
            name,
            source: source.map(|source| source.as_str().to_owned()),
            used_by,
        })
        .collect();
    let keychain = api.store.keychain();
    let keychain = Keychain { available: keychain.available, detail: keychain.detail.clone() };
    Ok(Json(Secrets { keychain, secrets }))
}

/// `PUT /v1/secrets/{name}`'s body.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PutBody {
    value: String,
}

fn checked_name(name: &str) -> Result<(), ApiError> {
    check_settable_name(name).map_err(store_error)
}

/// `PUT /v1/secrets/{name}`: saves a secret in the keychain when there is
/// one, else in the secrets file.
#[utoipa::path(
    put,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    params(("name" = String, Path, description = "1 to 64 lowercase letters, digits and `_`.")),
    request_body = PutBody,
    responses((status = 200, description = "Saved.", body = SecretSaved), Errors)
)]
async fn put(
    State(api): State<SecretsApi>,
    PathParams(name): PathParams<String>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<SecretSaved>, ApiError> {
    checked_name(&name)?;
    let body: PutBody = serde_json::from_value(body).map_err(|_| {
        ApiError::BadRequest("the body must be {\"value\": \"…\"} with a string value".to_owned())
    })?;
    if body.value.trim().is_empty() {
        return Err(ApiError::BadRequest("the value is blank".to_owned()));
    }
    if body.value.len() > MAX_VALUE_BYTES {
        return Err(ApiError::BadRequest(format!(
            "the value is longer than {MAX_VALUE_BYTES} bytes"
        )));
    }
    let store = api.store.clone();
    let key = name.clone();
    let source = blocking(move || store.store(&key, &body.value)).await?;
    tracing::info!(secret = %name, source = source.as_str(), "secret saved");
    api.changed.notify_one();
    Ok(Json(SecretSaved { name, source: source.as_str().to_owned() }))
}

/// `DELETE /v1/secrets/{name}`: removes a secret from the keychain and the
/// secrets file.
#[utoipa::path(
    delete,
    path = "/v1/secrets/{name}",
    tag = "secrets",
    params(("name" = String, Path, description = "The secret's name.")),
    responses(
        (status = 200, description = "Deleted.", body = SecretDeleted),
        (status = 404, description = "Not stored in the keychain or the secrets file.", body = ErrorBody),
        (status = 409, description = "Set in the gateway's environment.", body = ErrorBody),
        Errors,
    )
)]
async fn delete(
    State(api): State<SecretsApi>,
    PathParams(name): PathParams<String>,
) -> Result<Json<SecretDeleted>, ApiError> {
    checked_name(&name)?;
    let store = api.store.clone();
    let key = name.clone();
    let (deleted, left) = blocking(move || {
        let deleted = store.delete(&key)?;
        Ok((deleted, store.kind_of(&key)?))
    })
    .await?;
    if !deleted {
        return Err(match left {
            Some(SourceKind::Env) => ApiError::Conflict(format!(
                "secret {name:?} is set in the gateway's environment ({}); remove it there",
                lemon_core::secrets::env_var_name(&name)
            )),
            _ => ApiError::NotFound(format!(
                "secret {name:?} is not stored in the keychain or the secrets file"
            )),
        });
    }
    tracing::info!(secret = %name, "secret deleted");
    api.changed.notify_one();
    Ok(Json(SecretDeleted { deleted: true, name }))
}

#[cfg(test)]
mod tests;
