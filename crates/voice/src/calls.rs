//! Calls on record, in the kv store's `voice.calls` namespace keyed by the
//! CallSid, and the control API's view of them: `GET /v1/calls` and
//! `GET /v1/calls/{id}` (turns with their timings, the recording's path).

use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use lemon_api::error::{ApiError, PathParams};
use lemon_api::openapi::Errors;
use lemon_core::store::StoreHandle;
use serde_json::{json, Value};
use tokio::sync::Mutex;

/// The kv namespace of call records.
pub const CALLS_NAMESPACE: &str = "voice.calls";

/// Most calls `GET /v1/calls` lists, newest first.
const LIST_LIMIT: usize = 200;

/// Reads and writes call records. Cheap to clone; writes go one at a time,
/// so the call, its status callbacks and its recording never lose each
/// other's changes.
#[derive(Debug, Clone)]
pub struct CallRecords {
    store: StoreHandle,
    writes: Arc<Mutex<()>>,
}

impl CallRecords {
    pub fn new(store: StoreHandle) -> Self {
        CallRecords { store, writes: Arc::new(Mutex::new(())) }
    }

    /// The record of call `id`.
    pub async fn get(&self, id: &str) -> Option<Value> {
        let now = lemon_core::clock::now_ms();
        self.store.kv_get(CALLS_NAMESPACE, id, now).await.ok().flatten()
    }

    /// Changes the record of call `id` (created as `{}` if missing) with `edit`.
    pub async fn update(&self, id: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
        let _one_at_a_time = self.writes.lock().await;
        let mut record = match self.get(id).await {
            Some(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        edit(&mut record);
        self.store.kv_put(CALLS_NAMESPACE, id, Value::Object(record), None).await;
    }

    /// Every call on record, newest first.
    pub async fn list(&self) -> Result<Vec<Value>, ApiError> {
        let now = lemon_core::clock::now_ms();
        let records = self
            .store
            .kv_list(CALLS_NAMESPACE, now)
            .await
            .map_err(|e| ApiError::Internal(format!("calls unreadable: {e}")))?;
        let mut calls: Vec<Value> = records.into_iter().map(|(_, value)| value).collect();
        calls.sort_by_key(|call| std::cmp::Reverse(call["started_at_ms"].as_i64().unwrap_or(0)));
        calls.truncate(LIST_LIMIT);
        Ok(calls)
    }
}

/// The OpenAPI description of [`api_routes`], merged into the control API's
/// (`lemon_api::openapi::merge`).
pub fn api_doc() -> utoipa::openapi::OpenApi {
    #[derive(utoipa::OpenApi)]
    #[openapi(paths(list, one))]
    struct CallsDoc;
    <CallsDoc as utoipa::OpenApi>::openapi()
}

/// A call on record; a record grows as the call goes on, so every key but
/// `id` may be missing.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // The shape of the stored records, for the document only.
struct Call {
    /// The CallSid.
    id: String,
    from: Option<String>,
    to: Option<String>,
    /// `connecting`, `in_progress` or `ended`.
    status: Option<String>,
    /// Twilio's last status callback.
    twilio_status: Option<String>,
    stream_sid: Option<String>,
    session_key: Option<String>,
    started_at_ms: Option<i64>,
    connected_at_ms: Option<i64>,
    ended_at_ms: Option<i64>,
    end_reason: Option<String>,
    /// The recording, once Twilio has sent it.
    recording: Option<Value>,
    /// The turns with their timings (`GET /v1/calls/{id}` only).
    turns: Option<Vec<Value>>,
    /// How many turns (`GET /v1/calls` only).
    turn_count: Option<u64>,
}

/// `GET /v1/calls`.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // The shape of the handler's JSON, for the document only.
struct Calls {
    /// Newest first, at most 200.
    calls: Vec<Call>,
}

/// `GET /v1/calls` and `GET /v1/calls/{id}`, to merge into the control API
/// (behind its bearer token) with `lemon_api::api::router_with`.
pub fn api_routes(records: CallRecords) -> Router {
    Router::new()
        .route("/v1/calls", get(list))
        .route("/v1/calls/{id}", get(one))
        .with_state(records)
}

#[utoipa::path(
    get,
    path = "/v1/calls",
    tag = "calls",
    responses((status = 200, description = "Calls on record, newest first.", body = Calls), Errors)
)]
async fn list(State(records): State<CallRecords>) -> Result<Json<Value>, ApiError> {
    let calls = records.list().await?;
    // The list is a summary; a call's turns are in its own record.
    let calls: Vec<Value> = calls
        .into_iter()
        .map(|mut call| {
            let turns = call.get("turns").and_then(Value::as_array).map_or(0, Vec::len);
            if let Value::Object(map) = &mut call {
                map.remove("turns");
                map.insert("turn_count".into(), json!(turns));
            }
            call
        })
        .collect();
    Ok(Json(json!({ "calls": calls })))
}

#[utoipa::path(
    get,
    path = "/v1/calls/{id}",
    tag = "calls",
    params(("id" = String, Path, description = "The CallSid (`CA…`).")),
    responses(
        (status = 200, description = "The call with its turns.", body = Call),
        (status = 404, description = "No such call.", body = lemon_api::openapi::schema::Error),
        Errors,
    )
)]
async fn one(
    State(records): State<CallRecords>,
    PathParams(id): PathParams<String>,
) -> Result<Json<Value>, ApiError> {
    if !crate::twilio::is_sid(&id, "CA") {
        return Err(ApiError::BadRequest("a call id is a Twilio CallSid (CA…)".into()));
    }
    records.get(&id).await.map(Json).ok_or_else(|| ApiError::NotFound(format!("no call {id}")))
}

#[cfg(test)]
mod openapi_tests {
    use lemon_api::openapi::routes;
    use lemon_core::store::StoreHandle;

    #[tokio::test]
    async fn every_calls_route_is_in_its_document_and_nothing_else() {
        let records = super::CallRecords::new(StoreHandle::memory());
        let served = routes::served(&super::api_routes(records), None).await;
        assert_eq!(served.len(), 2, "{served:#?}");
        assert_eq!(served, routes::documented(&super::api_doc()));
    }
}
