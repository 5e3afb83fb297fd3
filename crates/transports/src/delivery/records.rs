//! Durable delivery records: what a channel still owes its users, kept in the
//! store's key-value records under the channel's namespace, one record per run.
//!
//! A channel records a delivery before it submits the run (so a restart finds
//! it), updates it as parts go out, finishes it once everything is delivered,
//! and gives up on it when the destination keeps refusing: a given-up record is
//! kept for a while (with an expiry) and counted, so status can say how many
//! answers were lost. At start, [`DeliveryRecords::recover`] lists what is still
//! owed. Store trouble is logged, never fatal: the store's writes report their
//! own failures, and a list that cannot be read recovers nothing.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lemon_core::store::StoreHandle;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// One channel's record of a delivery, as stored.
pub trait DeliveryRecord: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// Whether the channel gave up on this delivery (it stays on record until
    /// it expires, and is not retried).
    fn given_up(&self) -> bool;
}

/// What a start finds on record.
#[derive(Debug)]
pub struct Recovered<T> {
    /// Deliveries still owed, with their keys, in key order.
    pub pending: Vec<(String, T)>,
    /// Deliveries given up on and not expired yet.
    pub given_up: usize,
}

/// The delivery records of one channel (one store namespace). Cheap to clone;
/// clones share the count of deliveries given up on.
pub struct DeliveryRecords<T> {
    store: StoreHandle,
    namespace: &'static str,
    /// How long a record given up on stays.
    given_up_ttl: Duration,
    given_up: Arc<AtomicUsize>,
    clock: fn() -> i64,
    _record: PhantomData<fn() -> T>,
}

impl<T> Clone for DeliveryRecords<T> {
    fn clone(&self) -> Self {
        DeliveryRecords {
            store: self.store.clone(),
            namespace: self.namespace,
            given_up_ttl: self.given_up_ttl,
            given_up: self.given_up.clone(),
            clock: self.clock,
            _record: PhantomData,
        }
    }
}

impl<T> fmt::Debug for DeliveryRecords<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliveryRecords")
            .field("namespace", &self.namespace)
            .field("given_up_ttl", &self.given_up_ttl)
            .field("given_up", &self.given_up.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<T: DeliveryRecord> DeliveryRecords<T> {
    /// The records under `namespace` of `store`; one given up on stays for
    /// `given_up_ttl`.
    pub fn new(store: StoreHandle, namespace: &'static str, given_up_ttl: Duration) -> Self {
        DeliveryRecords::with_clock(store, namespace, given_up_ttl, lemon_core::clock::now_ms)
    }

    /// As [`DeliveryRecords::new`], with expiries timed by `clock` (ms since the epoch).
    pub fn with_clock(
        store: StoreHandle,
        namespace: &'static str,
        given_up_ttl: Duration,
        clock: fn() -> i64,
    ) -> Self {
        DeliveryRecords {
            store,
            namespace,
            given_up_ttl,
            given_up: Arc::new(AtomicUsize::new(0)),
            clock,
            _record: PhantomData,
        }
    }

    /// Records (or updates) the delivery `key`: it stays until finished or
    /// given up on.
    pub async fn record(&self, key: &str, record: &T) {
        let Some(value) = self.to_value(key, record) else { return };
        self.store.kv_put(self.namespace, key, value, None).await;
    }

    /// As [`DeliveryRecords::record`], and waits until the record is durable,
    /// for a step that must not be repeated after a crash.
    pub async fn record_durably(&self, key: &str, record: &T) {
        self.record(key, record).await;
        if let Err(error) = self.store.flush().await {
            tracing::warn!(namespace = self.namespace, %key, %error, "delivery record not saved");
        }
    }

    /// The delivery `key` is done: its record goes.
    pub async fn finish(&self, key: &str) {
        self.store.kv_delete(self.namespace, key).await;
    }

    /// Gives up on the delivery `key`: `record` (saying why, so that
    /// [`DeliveryRecord::given_up`] holds) is kept until the time to live runs
    /// out, and counted.
    pub async fn give_up(&self, key: &str, record: &T) {
        let ttl_ms = i64::try_from(self.given_up_ttl.as_millis()).unwrap_or(i64::MAX);
        let expires_at_ms = (self.clock)().saturating_add(ttl_ms);
        if let Some(value) = self.to_value(key, record) {
            self.store.kv_put(self.namespace, key, value, Some(expires_at_ms)).await;
        }
        self.given_up.fetch_add(1, Ordering::Relaxed);
    }

    /// Deliveries given up on: those found at the last [`DeliveryRecords::recover`]
    /// and those given up on since.
    pub fn given_up_count(&self) -> usize {
        self.given_up.load(Ordering::Relaxed)
    }

    /// What is on record, for a start to pick up: deliveries still owed, and the
    /// count of those given up on (which [`DeliveryRecords::given_up_count`]
    /// reports from now on). Records that do not parse are skipped with a
    /// warning; a store that cannot be read yields nothing.
    pub async fn recover(&self) -> Recovered<T> {
        let records = match self.store.kv_list(self.namespace, (self.clock)()).await {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(namespace = self.namespace, %error, "could not read pending deliveries");
                Vec::new()
            }
        };
        let mut recovered = Recovered { pending: Vec::new(), given_up: 0 };
        for (key, value) in records {
            match serde_json::from_value::<T>(value) {
                Ok(record) if record.given_up() => recovered.given_up += 1,
                Ok(record) => recovered.pending.push((key, record)),
                Err(error) => {
                    tracing::warn!(namespace = self.namespace, %key, %error, "unreadable delivery record skipped");
                }
            }
        }
        self.given_up.store(recovered.given_up, Ordering::Relaxed);
        recovered
    }

    fn to_value(&self, key: &str, record: &T) -> Option<serde_json::Value> {
        match serde_json::to_value(record) {
            Ok(value) => Some(value),
            Err(error) => {
                tracing::error!(namespace = self.namespace, %key, %error, "delivery record not serialisable");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Answer {
        chat: i64,
        #[serde(default)]
        sent: usize,
        #[serde(default)]
        failed: Option<String>,
    }

    impl DeliveryRecord for Answer {
        fn given_up(&self) -> bool {
            self.failed.is_some()
        }
    }

    const NS: &str = "test.delivery";
    const DAY: Duration = Duration::from_secs(24 * 60 * 60);

    fn answer(chat: i64) -> Answer {
        Answer { chat, sent: 0, failed: None }
    }

    /// Recording, updating, finishing and giving up, then what a new start finds.
    async fn lifecycle(store: StoreHandle) {
        let records = DeliveryRecords::<Answer>::new(store.clone(), NS, DAY);
        records.record("run-a", &answer(1)).await;
        records.record("run-b", &answer(2)).await;
        records.record("run-c", &answer(3)).await;
        records.record_durably("run-a", &Answer { sent: 2, ..answer(1) }).await;
        records.finish("run-b").await;
        records
            .give_up("run-c", &Answer { failed: Some("chat not found".into()), ..answer(3) })
            .await;
        assert_eq!(records.given_up_count(), 1);

        let after = DeliveryRecords::<Answer>::new(store.clone(), NS, DAY);
        let found = after.recover().await;
        assert_eq!(found.pending, vec![("run-a".to_owned(), Answer { sent: 2, ..answer(1) })]);
        assert_eq!(found.given_up, 1);
        assert_eq!(after.given_up_count(), 1);
    }

    /// A record given up on is kept for its time to live, then gone; the others stay.
    async fn given_up_expires(store: &StoreHandle) {
        let now = lemon_core::clock::now_ms();
        let stored = store.kv_get(NS, "run-c", now).await.unwrap();
        assert_eq!(stored.unwrap()["failed"], "chat not found");
        let later = now + i64::try_from(DAY.as_millis()).unwrap() + 60_000;
        assert_eq!(store.kv_get(NS, "run-c", later).await.unwrap(), None);
        assert_eq!(store.kv_get(NS, "run-a", later).await.unwrap().unwrap()["sent"], 2);
    }

    #[tokio::test]
    async fn records_live_until_finished_or_given_up_in_memory() {
        let store = StoreHandle::memory();
        lifecycle(store.clone()).await;
        given_up_expires(&store).await;
    }

    #[tokio::test]
    async fn records_live_until_finished_or_given_up_in_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lemon.db");
        let store = StoreHandle::open_sqlite(&path).unwrap();
        lifecycle(store.clone()).await;
        store.close().await.unwrap();

        // A second open of the same file, as after a restart.
        let store = StoreHandle::open_sqlite(&path).unwrap();
        let records = DeliveryRecords::<Answer>::new(store.clone(), NS, DAY);
        let found = records.recover().await;
        assert_eq!(found.pending.len(), 1);
        assert_eq!(found.pending[0].0, "run-a");
        assert_eq!(found.given_up, 1);
        given_up_expires(&store).await;
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_record_that_does_not_parse_is_skipped() {
        let store = StoreHandle::memory();
        store.kv_put(NS, "broken", json!({ "chat": "not a number" }), None).await;
        store.kv_put(NS, "fine", json!({ "chat": 7 }), None).await;
        let records = DeliveryRecords::<Answer>::new(store, NS, DAY);
        let found = records.recover().await;
        assert_eq!(found.pending, vec![("fine".to_owned(), answer(7))]);
        assert_eq!(found.given_up, 0);
    }

    #[tokio::test]
    async fn namespaces_are_apart() {
        let store = StoreHandle::memory();
        let one = DeliveryRecords::<Answer>::new(store.clone(), "one.delivery", DAY);
        let two = DeliveryRecords::<Answer>::new(store, "two.delivery", DAY);
        one.record("run-a", &answer(1)).await;
        assert!(two.recover().await.pending.is_empty());
        assert_eq!(one.recover().await.pending.len(), 1);
    }

    #[tokio::test]
    async fn a_closed_store_recovers_nothing_and_does_not_panic() {
        let dir = tempfile::tempdir().unwrap();
        let store = StoreHandle::open_sqlite(&dir.path().join("lemon.db")).unwrap();
        let records = DeliveryRecords::<Answer>::new(store.clone(), NS, DAY);
        records.record("run-a", &answer(1)).await;
        store.close().await.unwrap();
        records.record("run-b", &answer(2)).await;
        records.finish("run-a").await;
        records.give_up("run-b", &Answer { failed: Some("gone".into()), ..answer(2) }).await;
        let found = records.recover().await;
        assert!(found.pending.is_empty());
        assert_eq!(found.given_up, 0);
    }
}
