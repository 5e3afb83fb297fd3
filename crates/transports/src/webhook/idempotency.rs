//! Idempotency keys: the same key for the same integration answers with the first
//! request's response instead of submitting again, within a TTL and across
//! restarts.
//!
//! Two layers. Answers live in the store (`kv`, namespace
//! `webhook_idempotency:<integration>`, expiring `idempotency_ttl_ms` after the
//! key was first claimed), so they survive a restart. A key being processed is
//! claimed in memory first, so concurrent requests with one key never both
//! submit; the claim is released once the answer is in the store, or when the
//! request fails before submitting, so that request can be retried.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use lemon_core::store::{StoreError, StoreHandle};
use serde_json::{json, Value};

/// Wall-clock milliseconds; injectable so tests can move time.
pub(super) type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// (integration, key).
type Key = (String, String);

type Claims = Arc<Mutex<HashSet<Key>>>;

/// The store namespace of an integration's keys.
pub(super) fn namespace(integration: &str) -> String {
    format!("webhook_idempotency:{integration}")
}

/// Every integration's keys.
pub(super) struct IdempotencyKeys {
    store: StoreHandle,
    ttl_ms: i64,
    clock: Clock,
    /// Keys of requests being processed in this process.
    claims: Claims,
}

impl fmt::Debug for IdempotencyKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKeys").field("ttl_ms", &self.ttl_ms).finish_non_exhaustive()
    }
}

/// What claiming a key found.
#[derive(Debug)]
pub(super) enum Claim {
    /// First use: go ahead; the guard records the answer or releases the key.
    New(Guard),
    /// Seen before: replay this.
    Duplicate { status: StatusCode, body: Value },
    /// Another request with this key is being processed right now.
    InProgress,
}

/// A claimed key. Dropped before an answer was recorded, it releases the key, so
/// a request that failed before submitting can be retried.
#[derive(Debug)]
pub(super) struct Guard {
    store: StoreHandle,
    claims: Claims,
    key: Key,
    expires_at_ms: i64,
    /// Whether the in-memory claim is still held.
    held: bool,
}

impl IdempotencyKeys {
    pub(super) fn new(store: StoreHandle, ttl_ms: u64, clock: Clock) -> Self {
        IdempotencyKeys {
            store,
            ttl_ms: i64::try_from(ttl_ms).unwrap_or(i64::MAX),
            clock,
            claims: Arc::default(),
        }
    }

    /// Checks and reserves `key`, so concurrent duplicates submit once.
    ///
    /// # Errors
    /// The store could not be read; the key is not claimed.
    ///
    /// # Cancel safety
    /// Dropping the future releases the claim.
    pub(super) async fn claim(&self, integration: &str, key: &str) -> Result<Claim, StoreError> {
        let now_ms = (self.clock)();
        let claimed = (integration.to_owned(), key.to_owned());
        if !lock(&self.claims).insert(claimed.clone()) {
            return Ok(Claim::InProgress);
        }
        // From here on the guard releases the claim however this returns.
        let guard = Guard {
            store: self.store.clone(),
            claims: self.claims.clone(),
            key: claimed,
            expires_at_ms: now_ms.saturating_add(self.ttl_ms),
            held: true,
        };
        let stored = self.store.kv_get(&namespace(integration), key, now_ms).await?;
        match stored.as_ref().and_then(Answer::parse) {
            Some(answer) => Ok(Claim::Duplicate { status: answer.status, body: answer.body }),
            None => {
                if stored.is_some() {
                    tracing::warn!(integration, "unreadable idempotency record replaced");
                }
                Ok(Claim::New(guard))
            }
        }
    }
}

/// A stored answer: `{"status", "body"}`.
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    fn parse(value: &Value) -> Option<Answer> {
        let status = u16::try_from(value.get("status")?.as_u64()?).ok()?;
        Some(Answer {
            status: StatusCode::from_u16(status).ok()?,
            body: value.get("body")?.clone(),
        })
    }
}

impl Guard {
    /// Stores the answer duplicates get, then lets go of the in-memory claim: from
    /// here on the store answers for the key.
    async fn record(&mut self, status: StatusCode, body: Value) {
        let (integration, key) = &self.key;
        let answer = json!({ "status": status.as_u16(), "body": body });
        self.store.kv_put(&namespace(integration), key, answer, Some(self.expires_at_ms)).await;
        self.release();
    }

    /// The run was submitted: duplicates get this answer from now on, also after a
    /// restart (the record is flushed before this returns).
    pub(super) async fn submitted(mut self, status: StatusCode, body: Value) -> Guard {
        self.record(status, body).await;
        if let Err(error) = self.store.flush().await {
            tracing::warn!(%error, "idempotency record not flushed");
        }
        self
    }

    /// The final answer replaces the first one.
    pub(super) async fn complete(mut self, status: StatusCode, body: Value) {
        self.record(status, body).await;
    }

    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            lock(&self.claims).remove(&self.key);
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.release();
    }
}

fn lock(claims: &Claims) -> std::sync::MutexGuard<'_, HashSet<Key>> {
    claims.lock().unwrap_or_else(|e| e.into_inner())
}
