//! `GET /v1/config`: the config in force (defaults filled in, secrets
//! redacted), its generation, the edits waiting for a restart, and why the file
//! on disk was last refused.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::ApiState;

pub(super) async fn get(State(state): State<ApiState>) -> Json<Value> {
    let report = state.config.get();
    let pending: Vec<Value> = report
        .pending_restart
        .iter()
        .map(|p| json!({ "key": p.key, "running": p.running, "file": p.file }))
        .collect();
    let rejected = report.rejected.as_ref().map(|r| json!({ "error": r.error, "at_ms": r.at_ms }));
    Json(json!({
        "generation": report.generation,
        "effective": report.effective,
        "pending_restart": pending,
        "rejected": rejected,
        "file_missing": report.missing,
    }))
}
