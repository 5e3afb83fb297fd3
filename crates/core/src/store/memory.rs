//! The in-memory backend: the same interface as SQLite, for unit tests and benchmarks.
//! Writes apply immediately under a short lock, so `flush` has nothing to wait for.

use std::collections::{BTreeMap, HashMap, VecDeque};

use foldhash::fast::RandomState;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::{
    ChatState, ChatStateStore, FinishedRun, JournalEntry, JournalState, JournalStore, KvStore,
    NewRun, PruneStep, RetentionStore, RunEventStore, RunFilter, RunRecord, RunStore, StoreError,
    StoreLifecycle, StoredEvent, UsageFilter, UsageGroup, UsageStore, UsageTotals,
};
use crate::budget::usage::RunSpend;
use crate::bus::{BusEvent, RunStatus};
use crate::ids::{RunId, SessionKey};
use crate::timing::Stamps;

/// Runs, events and chat state in maps. Keeps at most `max_runs` runs: past
/// that, the oldest finished runs are forgotten with their events, so a
/// long-lived in-memory gateway does not grow without bound.
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Tables>,
    closed: AtomicBool,
    /// Flushes still to fail ([`MemoryStore::fail_next_flushes`]).
    unconfirmed_flushes: AtomicUsize,
    chat_state_ttl_ms: i64,
    max_runs: usize,
}

/// How many runs [`MemoryStore::new`] keeps.
pub const DEFAULT_MAX_RUNS: usize = 100_000;

#[derive(Debug, Default)]
struct Tables {
    runs: HashMap<String, RunRecord, RandomState>,
    /// Insertion order of runs, for newest-first listing and eviction.
    order: VecDeque<String>,
    events: HashMap<RunId, Vec<Arc<BusEvent>>, RandomState>,
    chat: HashMap<SessionKey, ChatState, RandomState>,
    /// The admission journal by run id.
    journal: HashMap<RunId, JournalEntry, RandomState>,
    /// Small records: namespace → key → record, keys in order for listing.
    kv: HashMap<String, BTreeMap<String, KvRecord>, RandomState>,
    /// Stage stamps of the runs in `runs`.
    stages: HashMap<String, Stamps, RandomState>,
}

/// One `kv` record.
#[derive(Debug, Clone)]
struct KvRecord {
    value: serde_json::Value,
    expires_at_ms: Option<i64>,
}

impl KvRecord {
    fn live_at(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_none_or(|expires| expires > now_ms)
    }
}

impl MemoryStore {
    pub fn new(chat_state_ttl_ms: i64) -> Self {
        MemoryStore::with_max_runs(chat_state_ttl_ms, DEFAULT_MAX_RUNS)
    }

    /// A store that keeps at most `max_runs` runs (unfinished ones are never dropped).
    pub fn with_max_runs(chat_state_ttl_ms: i64, max_runs: usize) -> Self {
        MemoryStore {
            inner: Mutex::new(Tables::default()),
            closed: AtomicBool::new(false),
            unconfirmed_flushes: AtomicUsize::new(0),
            chat_state_ttl_ms,
            max_runs: max_runs.max(1),
        }
    }

    /// The next `n` flushes fail as a database that went away fails them,
    /// while every write is kept (and counts, as when it comes back): what a
    /// caller sees when a store cannot confirm what it holds.
    pub fn fail_next_flushes(&self, n: usize) {
        self.unconfirmed_flushes.store(n, Ordering::Relaxed);
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn writable(&self) -> bool {
        if self.closed.load(Ordering::Relaxed) {
            tracing::warn!("write to a closed store dropped");
            return false;
        }
        true
    }
}

#[async_trait]
impl RunStore for MemoryStore {
    async fn insert_run(&self, run: NewRun) {
        if !self.writable() {
            return;
        }
        let record = RunRecord {
            run_id: run.run_id.to_string(),
            session_key: run.session_key,
            conversation: run.conversation,
            engine: run.engine,
            prompt: run.prompt,
            meta: run.meta,
            status: RunStatus::Queued,
            answer: None,
            error: None,
            error_code: None,
            resumed_from: run.resumed_from,
            resume: None,
            usage: serde_json::Value::Null,
            spend: RunSpend::default(),
            created_at_ms: run.created_at_ms,
            started_at_ms: None,
            completed_at_ms: None,
            duration_ms: None,
            compacted: None,
        };
        let mut tables = self.tables();
        // A repeated id (the router admits a run, the gateway inserts it again when it
        // sends it) replaces the run but keeps its place and creation time.
        let mut record = record;
        match tables.runs.get(&record.run_id) {
            Some(existing) => record.created_at_ms = existing.created_at_ms,
            None => tables.order.push_back(record.run_id.clone()),
        }
        tables.runs.insert(record.run_id.clone(), record);
        while tables.order.len() > self.max_runs {
            let finished = tables
                .order
                .front()
                .and_then(|oldest| tables.runs.get(oldest))
                .is_none_or(|run| run.status.is_terminal());
            if !finished {
                break;
            }
            if let Some(oldest) = tables.order.pop_front() {
                tables.runs.remove(&oldest);
                tables.stages.remove(&oldest);
                tables.events.remove(oldest.as_str());
            }
        }
    }

    async fn mark_running(&self, run_id: RunId, engine: String, started_at_ms: i64) {
        if !self.writable() {
            return;
        }
        if let Some(run) = self.tables().runs.get_mut(run_id.as_str()) {
            if !run.status.is_terminal() {
                run.status = RunStatus::Running;
            }
            run.engine = engine;
            run.started_at_ms = Some(started_at_ms);
        }
    }

    async fn mark_cancelling(&self, run_id: RunId) {
        if !self.writable() {
            return;
        }
        if let Some(run) = self.tables().runs.get_mut(run_id.as_str()) {
            if run.status == RunStatus::Running {
                run.status = RunStatus::Cancelling;
            }
        }
    }

    async fn finalize_run(&self, run: FinishedRun) {
        if !self.writable() {
            return;
        }
        if let Some(record) = self.tables().runs.get_mut(run.run_id.as_str()) {
            let completion = &run.completion;
            record.status = RunStatus::of(completion);
            record.engine = run.engine;
            record.answer = Some(completion.answer.clone());
            record.error = completion.error.as_ref().map(|e| e.to_string());
            record.error_code = completion.error.as_ref().map(|e| e.code().to_owned());
            record.resume = completion.resume.clone();
            record.usage = completion.usage.clone();
            record.spend = run.spend;
            record.completed_at_ms = Some(run.completed_at_ms);
            record.duration_ms = Some(run.duration_ms);
        }
    }

    async fn get_run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        Ok(self.tables().runs.get(run_id).cloned())
    }

    async fn list_runs(&self, filter: RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let tables = self.tables();
        Ok(tables
            .order
            .iter()
            .rev()
            .filter_map(|id| tables.runs.get(id))
            .filter(|run| filter.status.is_none_or(|status| run.status == status))
            .take(filter.limit)
            .cloned()
            .collect())
    }

    async fn session_runs(
        &self,
        session_key: &SessionKey,
        limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let tables = self.tables();
        Ok(tables
            .order
            .iter()
            .filter_map(|id| tables.runs.get(id))
            .filter(|run| run.session_key == *session_key)
            .take(limit)
            .cloned()
            .collect())
    }

    async fn merge_stages(&self, run_id: RunId, stamps: Stamps) {
        if !self.writable() {
            return;
        }
        let mut tables = self.tables();
        if tables.runs.contains_key(run_id.as_str()) {
            tables.stages.entry(run_id.as_str().to_owned()).or_default().merge(&stamps);
        }
    }

    async fn run_stages(&self, run_id: &str) -> Result<Stamps, StoreError> {
        Ok(self.tables().stages.get(run_id).copied().unwrap_or_default())
    }
}

#[async_trait]
impl RunEventStore for MemoryStore {
    async fn append_event(&self, event: Arc<BusEvent>) {
        if !self.writable() {
            return;
        }
        self.tables().events.entry(event.run_id.clone()).or_default().push(event);
    }

    async fn run_events(&self, run_id: &str) -> Result<Vec<StoredEvent>, StoreError> {
        let tables = self.tables();
        Ok(tables
            .events
            .get(run_id)
            .map(|events| {
                events
                    .iter()
                    .map(|event| StoredEvent {
                        index: event.index,
                        kind: event.kind.type_name().to_owned(),
                        data: event.to_json(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }
}

#[async_trait]
impl ChatStateStore for MemoryStore {
    async fn put_chat_state(
        &self,
        session_key: &SessionKey,
        last_engine: &str,
        last_resume_token: &str,
        now_ms: i64,
    ) {
        if !self.writable() {
            return;
        }
        let state = ChatState {
            last_engine: last_engine.to_owned(),
            last_resume_token: last_resume_token.to_owned(),
            updated_at_ms: now_ms,
            expires_at_ms: now_ms + self.chat_state_ttl_ms,
        };
        self.tables().chat.insert(session_key.clone(), state);
    }

    async fn get_chat_state(
        &self,
        session_key: &SessionKey,
        now_ms: i64,
    ) -> Result<Option<ChatState>, StoreError> {
        let mut tables = self.tables();
        match tables.chat.get(session_key) {
            Some(state) if state.expires_at_ms <= now_ms => {
                tables.chat.remove(session_key);
                Ok(None)
            }
            other => Ok(other.cloned()),
        }
    }

    async fn delete_chat_state(&self, session_key: &SessionKey) {
        self.tables().chat.remove(session_key);
    }
}

#[async_trait]
impl JournalStore for MemoryStore {
    async fn journal_admit(&self, entry: JournalEntry) {
        if !self.writable() {
            return;
        }
        self.tables().journal.insert(entry.run_id.clone(), entry);
    }

    async fn journal_mark_started(&self, run_id: &RunId) {
        if !self.writable() {
            return;
        }
        if let Some(entry) = self.tables().journal.get_mut(run_id) {
            entry.state = JournalState::Started;
        }
    }

    async fn journal_complete(&self, run_id: &RunId) {
        if !self.writable() {
            return;
        }
        self.tables().journal.remove(run_id);
    }

    async fn journal_pending(&self) -> Result<Vec<JournalEntry>, StoreError> {
        let mut entries: Vec<JournalEntry> = self.tables().journal.values().cloned().collect();
        entries.sort_by_key(|e| e.seq);
        Ok(entries)
    }
}

impl MemoryStore {
    /// The finished runs `filter` selects, with the key `group` sums them by.
    fn each_usage(&self, filter: &UsageFilter, mut f: impl FnMut(&RunRecord)) {
        let tables = self.tables();
        let selected = tables.runs.values().filter(|run| {
            run.completed_at_ms.is_some_and(|at| at >= filter.since_ms)
                && filter.session_key.as_ref().is_none_or(|key| &run.session_key == key)
                && filter.engine.as_ref().is_none_or(|engine| &run.engine == engine)
        });
        selected.for_each(&mut f);
    }
}

/// Retention is for the file: this store keeps its own bound (at most
/// `max_runs` runs, the oldest finished ones forgotten first) and nothing of it
/// outlives the process, so each step finds nothing to remove.
#[async_trait]
impl RetentionStore for MemoryStore {
    async fn prune(&self, _step: PruneStep) -> Result<u64, StoreError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(StoreError::Closed);
        }
        Ok(0)
    }

    async fn table_rows(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let tables = self.tables();
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Ok(vec![
            ("runs".to_owned(), count(tables.runs.len())),
            ("run_events".to_owned(), count(tables.events.values().map(Vec::len).sum())),
            ("journal".to_owned(), count(tables.journal.len())),
            ("kv".to_owned(), count(tables.kv.values().map(BTreeMap::len).sum())),
            ("chat_state".to_owned(), count(tables.chat.len())),
        ])
    }

    async fn used_bytes(&self) -> Result<u64, StoreError> {
        Ok(0)
    }
}

#[async_trait]
impl UsageStore for MemoryStore {
    async fn usage_totals(&self, filter: &UsageFilter) -> Result<UsageTotals, StoreError> {
        let mut totals = UsageTotals::default();
        self.each_usage(filter, |run| totals.add(&run.spend));
        Ok(totals)
    }

    async fn usage_by(
        &self,
        filter: &UsageFilter,
        group: UsageGroup,
    ) -> Result<Vec<(String, UsageTotals)>, StoreError> {
        let mut groups: std::collections::BTreeMap<String, UsageTotals> = Default::default();
        self.each_usage(filter, |run| {
            let key = match group {
                UsageGroup::Engine => run.engine.clone(),
                UsageGroup::Session => run.session_key.as_str().to_owned(),
            };
            groups.entry(key).or_default().add(&run.spend);
        });
        Ok(groups.into_iter().collect())
    }
}

#[async_trait]
impl KvStore for MemoryStore {
    async fn kv_put(
        &self,
        namespace: &str,
        key: &str,
        value: serde_json::Value,
        expires_at_ms: Option<i64>,
    ) {
        if !self.writable() {
            return;
        }
        let record = KvRecord { value, expires_at_ms };
        self.tables().kv.entry(namespace.to_owned()).or_default().insert(key.to_owned(), record);
    }

    async fn kv_get(
        &self,
        namespace: &str,
        key: &str,
        now_ms: i64,
    ) -> Result<Option<serde_json::Value>, StoreError> {
        let mut tables = self.tables();
        let Some(records) = tables.kv.get_mut(namespace) else { return Ok(None) };
        match records.get(key) {
            Some(record) if record.live_at(now_ms) => Ok(Some(record.value.clone())),
            Some(_) => {
                records.remove(key);
                Ok(None)
            }
            None => Ok(None),
        }
    }

    async fn kv_delete(&self, namespace: &str, key: &str) {
        if !self.writable() {
            return;
        }
        if let Some(records) = self.tables().kv.get_mut(namespace) {
            records.remove(key);
        }
    }

    async fn kv_list(
        &self,
        namespace: &str,
        now_ms: i64,
    ) -> Result<Vec<(String, serde_json::Value)>, StoreError> {
        let mut tables = self.tables();
        let Some(records) = tables.kv.get_mut(namespace) else { return Ok(Vec::new()) };
        // Listing visits every record of the namespace anyway, so expired ones go now.
        records.retain(|_, record| record.live_at(now_ms));
        Ok(records.iter().map(|(key, record)| (key.clone(), record.value.clone())).collect())
    }
}

#[async_trait]
impl StoreLifecycle for MemoryStore {
    async fn flush(&self) -> Result<(), StoreError> {
        let failing =
            self.unconfirmed_flushes
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Err(StoreError::Database("the database did not confirm the writes".to_owned()));
        }
        Ok(())
    }

    async fn check_writable(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    async fn close(&self) -> Result<(), StoreError> {
        self.closed.store(true, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
