//! The read-only side of the router: runs and their events as stored, sessions,
//! the scheduler's counters and what the engines offer. The control API and
//! health read through it; nothing here changes state.

use crate::engine::{Availability, ResumeToken};
use crate::gateway::{ActiveRun, SchedulerSnapshot, ShuttingDown};
use crate::ids::{RunId, SessionKey};
use crate::store::{RunFilter, RunRecord, StoreError, StoredEvent};

use super::{RouteError, RouterHandle, SessionView};

/// An engine as status reports show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineInfo {
    pub id: String,
    pub steer: bool,
    pub redirect: bool,
    pub availability: Availability,
    /// Where the engine's program was found ([`Engine::program`](crate::engine::Engine::program)).
    pub path: Option<std::path::PathBuf>,
    /// Filled by [`Runs::engines_with_versions`] only.
    pub version: Option<String>,
}

/// Read-only queries. Cheap to clone; made by [`RouterHandle::query`].
#[derive(Debug, Clone)]
pub struct Runs {
    router: RouterHandle,
}

impl Runs {
    pub(super) fn new(router: RouterHandle) -> Self {
        Runs { router }
    }

    /// A run as stored (queued, running or finished).
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    pub async fn get(&self, run_id: &RunId) -> Result<Option<RunRecord>, StoreError> {
        self.router.store.get_run(run_id.as_str()).await
    }

    /// Runs as stored, newest first.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    pub async fn list(&self, filter: RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.router.store.list_runs(filter).await
    }

    /// The runs of one session, oldest first, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    pub async fn session_runs(
        &self,
        session_key: &SessionKey,
        limit: usize,
    ) -> Result<Vec<RunRecord>, StoreError> {
        self.router.store.session_runs(session_key, limit).await
    }

    /// The stored events of each of `run_ids`, in its order, each run's in
    /// index order, read at one moment.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    pub async fn runs_events(
        &self,
        run_ids: Vec<String>,
    ) -> Result<Vec<Vec<StoredEvent>>, StoreError> {
        self.router.store.runs_events(run_ids).await
    }

    /// Rows per table of the store, by table name.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    pub async fn table_rows(&self) -> Result<Vec<(String, u64)>, StoreError> {
        self.router.store.retention().table_rows().await
    }

    /// Bytes the store's data takes (what `max_db_mb` bounds).
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    pub async fn store_bytes(&self) -> Result<u64, StoreError> {
        self.router.store.retention().used_bytes().await
    }

    /// A run's stored events, in index order.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read.
    pub async fn events(&self, run_id: &RunId) -> Result<Vec<StoredEvent>, StoreError> {
        let mut events = self.router.store.run_events(run_id.as_str()).await?;
        events.sort_by_key(|event| event.index);
        Ok(events)
    }

    /// The session's active runs, queue and chat state.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn session(&self, session_key: &SessionKey) -> Result<SessionView, RouteError> {
        self.router.session(session_key).await
    }

    /// Requests waiting in each session's queue at the router (see
    /// [`RouterHandle::session_queues`]).
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn session_queues(&self) -> Result<Vec<(SessionKey, usize)>, RouteError> {
        self.router.session_queues().await
    }

    /// The scheduler's counters.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn snapshot(&self) -> Result<SchedulerSnapshot, ShuttingDown> {
        self.router.gateway.snapshot().await
    }

    /// Every queued or running run at the gateway, oldest first.
    ///
    /// # Errors
    /// [`ShuttingDown`] when the gateway is gone.
    pub async fn active_runs(&self) -> Result<Vec<ActiveRun>, ShuttingDown> {
        self.router.gateway.active_runs().await
    }

    /// Whether the store accepts writes (for health).
    ///
    /// # Errors
    /// [`StoreError`] when it does not.
    pub async fn check_store(&self) -> Result<(), StoreError> {
        self.router.store.check_writable().await
    }

    /// Every registered engine, in registration order.
    pub fn engines(&self) -> Vec<EngineInfo> {
        self.router
            .gateway
            .engines()
            .iter()
            .map(|engine| {
                let capabilities = engine.capabilities();
                EngineInfo {
                    id: engine.id().to_string(),
                    steer: capabilities.steer,
                    redirect: capabilities.redirect,
                    availability: engine.availability(),
                    path: engine.program(),
                    version: None,
                }
            })
            .collect()
    }

    /// As [`Runs::engines`], with each engine's version: the first call per
    /// engine asks its program (bounded by the engine), later ones read its cache.
    pub async fn engines_with_versions(&self) -> Vec<EngineInfo> {
        let registry = self.router.gateway.engines();
        let mut out = self.engines();
        for info in &mut out {
            if let Some(engine) = registry.get(&info.id) {
                info.version = engine.version().await;
            }
        }
        out
    }

    /// The line that continues `token`'s session, as its engine writes it.
    pub fn format_resume(&self, token: &ResumeToken) -> String {
        self.router.gateway.engines().format_resume(token)
    }

    /// A resume line of any engine found in `text`.
    pub fn extract_resume(&self, text: &str) -> Option<ResumeToken> {
        self.router.gateway.engines().extract_resume(text)
    }
}
