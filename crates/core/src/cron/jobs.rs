//! Jobs and their runs in the store's `kv`: namespace `cron_jobs` (key = job
//! id, value = [`CronJob`]) and `cron_runs:<job id>` (key = run id, value =
//! [`CronRun`]); retention keeps the newest `cron_runs_kept` runs of each job
//! ([`CronJobs::trim_runs`]).

use serde::Deserialize;

use super::{CronJob, CronRun};
use crate::clock::now_ms;
use crate::store::{StoreError, StoreHandle};

/// The `kv` namespace of jobs.
pub const JOBS_NAMESPACE: &str = "cron_jobs";

/// The `kv` namespace of one job's runs.
pub fn runs_namespace(job_id: &str) -> String {
    format!("cron_runs:{job_id}")
}

/// The cron records of a store. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CronJobs {
    store: StoreHandle,
}

impl CronJobs {
    pub fn new(store: StoreHandle) -> Self {
        CronJobs { store }
    }

    /// Every stored job; an unreadable record is dropped with a warning.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    pub async fn load(&self) -> Result<Vec<CronJob>, StoreError> {
        let records = self.store.kv_list(JOBS_NAMESPACE, now_ms()).await?;
        let mut jobs = Vec::with_capacity(records.len());
        for (key, value) in records {
            match CronJob::deserialize(&value) {
                Ok(job) => jobs.push(job),
                Err(error) => {
                    tracing::warn!(key, %error, "unreadable cron job dropped");
                    self.store.kv_delete(JOBS_NAMESPACE, &key).await;
                }
            }
        }
        Ok(jobs)
    }

    /// Writes (or overwrites) a job.
    pub async fn put(&self, job: &CronJob) {
        match serde_json::to_value(job) {
            Ok(value) => self.store.kv_put(JOBS_NAMESPACE, &job.id, value, None).await,
            Err(error) => tracing::warn!(job = %job.id, %error, "cron job not stored"),
        }
    }

    /// Removes a job and its runs.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    pub async fn delete(&self, job_id: &str) -> Result<(), StoreError> {
        self.store.kv_delete(JOBS_NAMESPACE, job_id).await;
        let namespace = runs_namespace(job_id);
        for (key, _) in self.store.kv_list(&namespace, now_ms()).await? {
            self.store.kv_delete(&namespace, &key).await;
        }
        Ok(())
    }

    /// Writes (or overwrites) a run.
    ///
    /// # Errors
    /// The run cannot be serialised.
    pub async fn put_run(&self, run: &CronRun) -> Result<(), StoreError> {
        let namespace = runs_namespace(&run.job_id);
        let value = serde_json::to_value(run)
            .map_err(|e| StoreError::Corrupt(format!("cron run {}: {e}", run.id)))?;
        self.store.kv_put(&namespace, &run.id, value, None).await;
        Ok(())
    }

    /// Drops every job's runs past its newest `kept`; how many went.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    pub async fn trim_runs(&self, kept: usize) -> Result<u64, StoreError> {
        let mut removed = 0;
        for job in self.load().await? {
            let namespace = runs_namespace(&job.id);
            for old in self.runs(&job.id).await?.iter().skip(kept) {
                self.store.kv_delete(&namespace, &old.id).await;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// A job's runs, newest first.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    pub async fn runs(&self, job_id: &str) -> Result<Vec<CronRun>, StoreError> {
        let records = self.store.kv_list(&runs_namespace(job_id), now_ms()).await?;
        let mut runs: Vec<CronRun> = records
            .into_iter()
            .filter_map(|(_, value)| CronRun::deserialize(&value).ok())
            .collect();
        runs.sort_by(|a, b| (b.started_at_ms, &b.id).cmp(&(a.started_at_ms, &a.id)));
        Ok(runs)
    }

    /// One run of a job.
    ///
    /// # Errors
    /// The store is closed or cannot be read.
    pub async fn run(&self, job_id: &str, run_id: &str) -> Result<Option<CronRun>, StoreError> {
        let value = self.store.kv_get(&runs_namespace(job_id), run_id, now_ms()).await?;
        Ok(value.and_then(|value| CronRun::deserialize(&value).ok()))
    }
}
