//! The cron actor: owns the jobs, sleeps until the next one is due, and fires
//! it by submitting its prompt through the router in the job's session. Each
//! firing is a task that follows the router's run to its end, cancels it after
//! the job's `timeout_ms`, retries a failure with backoff, and reports every
//! change of its [`CronRun`] back to the actor, which stores it.
//!
//! Wall-clock time comes from a [`WallClock`] (the system clock in the
//! gateway); waiting uses tokio's clock, so tests run the actor under paused
//! time with a clock that follows tokio's.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::{sleep, sleep_until, timeout, Instant};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::jobs::CronJobs;
use super::schedule::{parse_timezone, Schedule, ScheduleError};
use super::{
    agent_of, truncate, CronJob, CronRun, CronRunStatus, JobPatch, JobSource, JobSpec, Trigger,
    DEFAULT_RETRY_BACKOFF_MS, DEFAULT_TIMEOUT_MS, DEFAULT_TIMEZONE, MAX_DURATION_MS,
    MAX_JITTER_SEC, MAX_RETRIES, OUTPUT_LIMIT,
};
use crate::bus::EventKind;
use crate::ids::{RunId, SessionKey};
use crate::router::{Origin, RouterHandle, RunRequest, Submitted};
use crate::store::{StoreError, StoreHandle};

/// Wall-clock milliseconds since the Unix epoch.
pub trait WallClock: Send + Sync + fmt::Debug + 'static {
    fn now_ms(&self) -> i64;
}

/// The system clock ([`crate::clock::now_ms`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now_ms(&self) -> i64 {
        crate::clock::now_ms()
    }
}

/// The longest the actor sleeps before it looks at the wall clock again, so a
/// clock that jumps (a suspended laptop, an NTP step) is noticed soon.
const MAX_NAP: Duration = Duration::from_secs(60);

/// In a cluster, the longest the firing node sleeps before it reads the jobs
/// again, so a job another node added or edited fires on time within this.
const CLUSTER_NAP: Duration = Duration::from_secs(5);

/// The next change of `leader`; never, for a gateway that has none.
async fn changed(
    leader: Option<&mut watch::Receiver<bool>>,
) -> Result<(), watch::error::RecvError> {
    match leader {
        Some(leader) => leader.changed().await,
        None => std::future::pending().await,
    }
}

/// The longest retry backoff, however many attempts came before.
const MAX_BACKOFF_MS: u64 = 3_600_000;

/// Why a cron operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronError {
    #[error("cron job not found: {id}")]
    NotFound { id: String },
    #[error("cron run not found: {id}")]
    RunNotFound { id: String },
    #[error("cron run is not active: {id}")]
    RunNotActive { id: String },
    /// The schedule text is not one.
    #[error("invalid schedule {schedule:?}: {error}")]
    Schedule { schedule: String, error: ScheduleError },
    /// Another field is out of bounds; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// Another job already has this name.
    #[error("a cron job named {name:?} already exists")]
    DuplicateName { name: String },
    /// A job from `config.toml` is changed there, not here.
    #[error("cron job {id} is defined in config.toml; edit it there")]
    ConfigJob { id: String },
    #[error("cron store: {0}")]
    Store(#[from] StoreError),
    #[error("the cron scheduler is shutting down")]
    ShuttingDown,
}

/// `status`: what the scheduler holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronStatus {
    pub job_count: usize,
    /// Enabled jobs.
    pub active_jobs: usize,
    /// The earliest next firing of an enabled job.
    pub next_run_at_ms: Option<i64>,
    /// Runs going on now.
    pub running: usize,
}

/// A job of `config.toml` (`[[gateway.cron]]`), identified by its name.
pub type ConfigJob = JobSpec;

enum CronMsg {
    List {
        reply: oneshot::Sender<Vec<CronJob>>,
    },
    Get {
        id: String,
        reply: oneshot::Sender<Option<CronJob>>,
    },
    Add {
        spec: Box<JobSpec>,
        reply: oneshot::Sender<Result<CronJob, CronError>>,
    },
    Update {
        id: String,
        patch: Box<JobPatch>,
        reply: oneshot::Sender<Result<CronJob, CronError>>,
    },
    Remove {
        id: String,
        reply: oneshot::Sender<Result<CronJob, CronError>>,
    },
    Trigger {
        id: String,
        reply: oneshot::Sender<Result<CronRun, CronError>>,
    },
    Runs {
        id: String,
        reply: oneshot::Sender<Result<Vec<CronRun>, CronError>>,
    },
    Abort {
        run_id: String,
        reply: oneshot::Sender<Result<CronRun, CronError>>,
    },
    Status {
        reply: oneshot::Sender<CronStatus>,
    },
    SyncConfig {
        jobs: Vec<ConfigJob>,
        reply: oneshot::Sender<()>,
    },
    /// A firing's run changed (sent by its task).
    Progress {
        run: CronRun,
    },
}

/// The handle to the cron actor. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CronHandle {
    tx: mpsc::Sender<CronMsg>,
    /// Every change of a run, once stored.
    updates: broadcast::Sender<CronRun>,
}

impl fmt::Debug for CronMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CronMsg")
    }
}

/// What the actor needs.
#[derive(Debug, Clone)]
pub struct CronDeps {
    pub router: RouterHandle,
    pub store: StoreHandle,
    pub clock: Arc<dyn WallClock>,
}

impl CronHandle {
    /// Starts the actor on `tracker`; it stops when `token` is cancelled. Before
    /// it answers anything it loads the stored jobs and puts `config_jobs` in
    /// step with them. A job whose firing was due while the gateway was down
    /// fires once, now. Runs a stopped gateway left going are recorded as failed.
    pub fn start(
        deps: CronDeps,
        config_jobs: Vec<ConfigJob>,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> CronHandle {
        Self::start_led(deps, config_jobs, None, token, tracker)
    }

    /// [`CronHandle::start`] for a node of a cluster: every node answers the
    /// API and the tool from the shared store, and only while `leader` says
    /// `true` does this node fire scheduled jobs. On becoming the leader it
    /// reads the jobs again and records the runs a previous leader left going
    /// as failed; while leading it reads them before each firing, so edits
    /// made on other nodes count and nothing fires twice.
    pub fn start_led(
        deps: CronDeps,
        config_jobs: Vec<ConfigJob>,
        leader: Option<watch::Receiver<bool>>,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> CronHandle {
        let (tx, rx) = mpsc::channel(256);
        let (updates, _) = broadcast::channel(256);
        let records = CronJobs::new(deps.store.clone());
        let actor = Cron {
            rx,
            tx: tx.clone(),
            records,
            deps,
            jobs: BTreeMap::new(),
            active: HashMap::new(),
            token,
            tracker: tracker.clone(),
            updates: updates.clone(),
            leader,
        };
        tracker.spawn(actor.run(config_jobs));
        CronHandle { tx, updates }
    }

    async fn ask<T>(
        &self,
        msg: impl FnOnce(oneshot::Sender<T>) -> CronMsg,
    ) -> Result<T, CronError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(msg(reply)).await.map_err(|_| CronError::ShuttingDown)?;
        rx.await.map_err(|_| CronError::ShuttingDown)
    }

    /// Every change of a run from now on (started, retrying, ended), once it is
    /// stored. A receiver that falls behind is told how many it missed.
    pub fn subscribe_runs(&self) -> broadcast::Receiver<CronRun> {
        self.updates.subscribe()
    }

    /// Every job, by id.
    ///
    /// # Errors
    /// [`CronError::ShuttingDown`].
    pub async fn list(&self) -> Result<Vec<CronJob>, CronError> {
        self.ask(|reply| CronMsg::List { reply }).await
    }

    /// One job.
    ///
    /// # Errors
    /// [`CronError::NotFound`], [`CronError::ShuttingDown`].
    pub async fn get(&self, id: &str) -> Result<CronJob, CronError> {
        self.ask(|reply| CronMsg::Get { id: id.to_owned(), reply })
            .await?
            .ok_or_else(|| CronError::NotFound { id: id.to_owned() })
    }

    /// Adds a job.
    ///
    /// # Errors
    /// A field is invalid ([`CronError::Schedule`], [`CronError::Invalid`]).
    pub async fn add(&self, spec: JobSpec) -> Result<CronJob, CronError> {
        self.ask(|reply| CronMsg::Add { spec: Box::new(spec), reply }).await?
    }

    /// Changes a job; its next firing is computed again.
    ///
    /// # Errors
    /// Not found, or a field is invalid.
    pub async fn update(&self, id: &str, patch: JobPatch) -> Result<CronJob, CronError> {
        self.ask(|reply| CronMsg::Update { id: id.to_owned(), patch: Box::new(patch), reply })
            .await?
    }

    /// Removes a job and its runs.
    ///
    /// # Errors
    /// Not found.
    pub async fn remove(&self, id: &str) -> Result<CronJob, CronError> {
        self.ask(|reply| CronMsg::Remove { id: id.to_owned(), reply }).await?
    }

    /// Fires a job now, whatever its schedule; its next scheduled firing stays.
    ///
    /// # Errors
    /// Not found.
    pub async fn trigger(&self, id: &str) -> Result<CronRun, CronError> {
        self.ask(|reply| CronMsg::Trigger { id: id.to_owned(), reply }).await?
    }

    /// A job's runs, newest first.
    ///
    /// # Errors
    /// Not found, or the store cannot be read.
    pub async fn runs(&self, id: &str) -> Result<Vec<CronRun>, CronError> {
        self.ask(|reply| CronMsg::Runs { id: id.to_owned(), reply }).await?
    }

    /// Stops a run going on now (its router run is cancelled, no retry follows).
    ///
    /// # Errors
    /// [`CronError::RunNotFound`], [`CronError::RunNotActive`].
    pub async fn abort(&self, run_id: &str) -> Result<CronRun, CronError> {
        self.ask(|reply| CronMsg::Abort { run_id: run_id.to_owned(), reply }).await?
    }

    /// Counts and the next firing.
    ///
    /// # Errors
    /// [`CronError::ShuttingDown`].
    pub async fn status(&self) -> Result<CronStatus, CronError> {
        self.ask(|reply| CronMsg::Status { reply }).await
    }

    /// Puts the jobs of `config.toml` in force: a job is matched by its name,
    /// added, changed, or removed when the file no longer has it.
    ///
    /// # Errors
    /// [`CronError::ShuttingDown`].
    pub async fn sync_config(&self, jobs: Vec<ConfigJob>) -> Result<(), CronError> {
        self.ask(|reply| CronMsg::SyncConfig { jobs, reply }).await
    }
}

/// A firing going on.
#[derive(Debug)]
struct ActiveRun {
    /// The latest record its task reported.
    run: CronRun,
    /// Cancelled by `abort`.
    abort: CancellationToken,
}

/// The actor. Owns the jobs and the runs going on; never awaits a firing.
#[derive(Debug)]
struct Cron {
    rx: mpsc::Receiver<CronMsg>,
    /// Given to each firing's task for its reports.
    tx: mpsc::Sender<CronMsg>,
    records: CronJobs,
    deps: CronDeps,
    /// Every job, by id; written to the store on each change.
    jobs: BTreeMap<String, CronJob>,
    /// Firings going on, by cron run id; removed when their task reports the end.
    active: HashMap<String, ActiveRun>,
    token: CancellationToken,
    tracker: TaskTracker,
    /// Where stored run changes are published.
    updates: broadcast::Sender<CronRun>,
    /// In a cluster: whether this node is the one that fires scheduled jobs
    /// (it holds the cron lease). `None`: a single gateway, which always does.
    leader: Option<watch::Receiver<bool>>,
}

impl Cron {
    fn now_ms(&self) -> i64 {
        self.deps.clock.now_ms()
    }

    /// Whether this node fires scheduled jobs now.
    fn leads(&self) -> bool {
        self.leader.as_ref().is_none_or(|leader| *leader.borrow())
    }

    /// Reads every job from the store; with `close_left_runs`, records the
    /// runs a stopped gateway (or a previous leader) left going as failed.
    async fn load(&mut self, close_left_runs: bool) -> Result<(), CronError> {
        let now = self.now_ms();
        self.jobs.clear();
        for mut job in self.records.load().await? {
            // Runs a stopped gateway left going will not report again.
            for mut run in self.records.runs(&job.id).await? {
                if close_left_runs && run.status.is_active() && !self.active.contains_key(&run.id) {
                    run.status = CronRunStatus::Failed;
                    run.ended_at_ms = Some(now);
                    run.output = Some("interrupted: the gateway stopped during the run".to_owned());
                    self.records.put_run(&run).await?;
                }
            }
            if job.enabled && job.next_run_at_ms.is_none() {
                job.next_run_at_ms = next_run(&job, now);
                self.records.put(&job).await;
            }
            self.jobs.insert(job.id.clone(), job);
        }
        Ok(())
    }

    async fn run(mut self, config_jobs: Vec<ConfigJob>) {
        // In a cluster the leader's runs are its own to finish: only a node
        // that takes the lead closes what its predecessor left going.
        if let Err(error) = self.load(self.leader.is_none()).await {
            tracing::error!(%error, "stored cron jobs could not be read");
        }
        self.sync_config(config_jobs).await;
        let mut leader = self.leader.clone();
        loop {
            let wake = self.next_wake();
            let leads = self.leads();
            tokio::select! {
                () = self.token.cancelled() => break,
                msg = self.rx.recv() => match msg {
                    Some(msg) => self.handle(msg).await,
                    None => break,
                },
                () = sleep_until(wake), if leads => {
                    if self.leader.is_some() {
                        // Other nodes may have added, edited or fired jobs.
                        if let Err(error) = self.load(false).await {
                            tracing::warn!(%error, "cron jobs not read again; firing what is known");
                        }
                    }
                    self.fire_due().await;
                }
                changed = changed(leader.as_mut()) => {
                    if changed.is_err() {
                        // The lease's owner is gone: this node fires nothing more.
                        leader = None;
                        self.leader = Some(watch::channel(false).1);
                        continue;
                    }
                    if self.leads() {
                        tracing::info!("this node fires the scheduled jobs now");
                        if let Err(error) = self.load(true).await {
                            tracing::error!(%error, "stored cron jobs could not be read");
                        }
                    }
                }
            }
        }
    }

    /// When the earliest enabled job is due, at most [`MAX_NAP`] from now
    /// ([`CLUSTER_NAP`] in a cluster).
    fn next_wake(&self) -> Instant {
        let now = self.now_ms();
        let next =
            self.jobs.values().filter(|job| job.enabled).filter_map(|job| job.next_run_at_ms).min();
        let longest = if self.leader.is_some() { CLUSTER_NAP } else { MAX_NAP };
        let nap = match next {
            Some(at) => Duration::from_millis(u64::try_from(at - now).unwrap_or(0)).min(longest),
            None => longest,
        };
        Instant::now() + nap
    }

    async fn fire_due(&mut self) {
        let now = self.now_ms();
        let due: Vec<String> = self
            .jobs
            .values()
            .filter(|job| job.enabled && job.next_run_at_ms.is_some_and(|at| at <= now))
            .map(|job| job.id.clone())
            .collect();
        for id in due {
            let Some(job) = self.jobs.get_mut(&id) else { continue };
            // Computed from now, so slots missed while the gateway was down fire once.
            job.next_run_at_ms = next_run(job, now);
            job.last_run_at_ms = Some(now);
            let job = job.clone();
            self.records.put(&job).await;
            self.start_run(job, Trigger::Schedule).await;
        }
    }

    async fn start_run(&mut self, job: CronJob, trigger: Trigger) -> CronRun {
        let run = CronRun {
            id: format!("cronrun_{}", uuid::Uuid::now_v7().simple()),
            job_id: job.id.clone(),
            router_run_id: None,
            status: CronRunStatus::Running,
            trigger,
            attempt: 1,
            started_at_ms: self.now_ms(),
            ended_at_ms: None,
            output: None,
        };
        tracing::info!(job = %job.id, run = %run.id, ?trigger, "cron job fired");
        if let Err(error) = self.records.put_run(&run).await {
            tracing::warn!(job = %job.id, %error, "cron run not recorded");
        }
        let abort = self.token.child_token();
        self.active.insert(run.id.clone(), ActiveRun { run: run.clone(), abort: abort.clone() });
        let firing = Firing {
            router: self.deps.router.clone(),
            clock: self.deps.clock.clone(),
            tx: self.tx.clone(),
            job,
            run: run.clone(),
            abort,
            shutdown: self.token.clone(),
        };
        self.tracker.spawn(firing.run());
        run
    }

    async fn handle(&mut self, msg: CronMsg) {
        match msg {
            CronMsg::List { reply } => {
                let _ = reply.send(self.jobs.values().cloned().collect());
            }
            CronMsg::Get { id, reply } => {
                let _ = reply.send(self.jobs.get(&id).cloned());
            }
            CronMsg::Add { spec, reply } => {
                let _ = reply.send(self.add(*spec, JobSource::Api).await);
            }
            CronMsg::Update { id, patch, reply } => {
                let _ = reply.send(self.update(&id, *patch, false).await);
            }
            CronMsg::Remove { id, reply } => {
                let _ = reply.send(self.remove(&id).await);
            }
            CronMsg::Trigger { id, reply } => {
                let result = match self.jobs.get_mut(&id) {
                    Some(job) => {
                        job.last_run_at_ms = Some(self.deps.clock.now_ms());
                        let job = job.clone();
                        self.records.put(&job).await;
                        Ok(self.start_run(job, Trigger::Manual).await)
                    }
                    None => Err(CronError::NotFound { id }),
                };
                let _ = reply.send(result);
            }
            CronMsg::Runs { id, reply } => {
                let result = if self.jobs.contains_key(&id) {
                    self.records.runs(&id).await.map_err(CronError::from)
                } else {
                    Err(CronError::NotFound { id })
                };
                let _ = reply.send(result);
            }
            CronMsg::Abort { run_id, reply } => {
                let _ = reply.send(self.abort(&run_id).await);
            }
            CronMsg::Status { reply } => {
                let enabled = || self.jobs.values().filter(|job| job.enabled);
                let _ = reply.send(CronStatus {
                    job_count: self.jobs.len(),
                    active_jobs: enabled().count(),
                    next_run_at_ms: enabled().filter_map(|job| job.next_run_at_ms).min(),
                    running: self.active.len(),
                });
            }
            CronMsg::SyncConfig { jobs, reply } => {
                self.sync_config(jobs).await;
                let _ = reply.send(());
            }
            CronMsg::Progress { run } => {
                if let Err(error) = self.records.put_run(&run).await {
                    tracing::warn!(run = %run.id, %error, "cron run not recorded");
                }
                let _ = self.updates.send(run.clone());
                if run.status.is_active() {
                    if let Some(active) = self.active.get_mut(&run.id) {
                        active.run = run;
                    }
                } else {
                    tracing::info!(job = %run.job_id, run = %run.id, status = run.status.as_str(), "cron run ended");
                    self.active.remove(&run.id);
                }
            }
        }
    }

    async fn add(&mut self, spec: JobSpec, source: JobSource) -> Result<CronJob, CronError> {
        let now = self.now_ms();
        let id = format!("cron_{}", uuid::Uuid::now_v7().simple());
        let mut job = build_job(id, spec, source, now)?;
        if self.jobs.values().any(|other| other.name == job.name) {
            return Err(CronError::DuplicateName { name: job.name });
        }
        job.next_run_at_ms = next_run(&job, now);
        self.records.put(&job).await;
        self.jobs.insert(job.id.clone(), job.clone());
        Ok(job)
    }

    async fn update(
        &mut self,
        id: &str,
        patch: JobPatch,
        from_config: bool,
    ) -> Result<CronJob, CronError> {
        let Some(old) = self.jobs.get(id) else {
            return Err(CronError::NotFound { id: id.to_owned() });
        };
        // Pausing and resuming a config job is fine; its fields belong to the file.
        let only_enabled = JobPatch { enabled: None, ..patch.clone() }.is_empty();
        if old.source == JobSource::Config && !from_config && !only_enabled {
            return Err(CronError::ConfigJob { id: id.to_owned() });
        }
        if let Some(name) = &patch.name {
            if self.jobs.values().any(|other| other.id != id && &other.name == name) {
                return Err(CronError::DuplicateName { name: name.clone() });
            }
        }
        let now = self.now_ms();
        let job = apply_patch(old, patch, now)?;
        let timing_changed = job.schedule != old.schedule
            || job.timezone != old.timezone
            || job.enabled != old.enabled
            || job.jitter_sec != old.jitter_sec
            || old.next_run_at_ms.is_none();
        let mut job = job;
        if !job.enabled {
            job.next_run_at_ms = None;
        } else if timing_changed {
            job.next_run_at_ms = next_run(&job, now);
        }
        self.records.put(&job).await;
        self.jobs.insert(job.id.clone(), job.clone());
        Ok(job)
    }

    async fn remove(&mut self, id: &str) -> Result<CronJob, CronError> {
        let job = self.jobs.remove(id).ok_or_else(|| CronError::NotFound { id: id.to_owned() })?;
        self.records.delete(id).await?;
        Ok(job)
    }

    async fn abort(&mut self, run_id: &str) -> Result<CronRun, CronError> {
        if let Some(active) = self.active.get(run_id) {
            active.abort.cancel();
            let mut run = active.run.clone();
            run.status = CronRunStatus::Aborted;
            return Ok(run);
        }
        for job_id in self.jobs.keys() {
            if self.records.run(job_id, run_id).await?.is_some() {
                return Err(CronError::RunNotActive { id: run_id.to_owned() });
            }
        }
        Err(CronError::RunNotFound { id: run_id.to_owned() })
    }

    async fn sync_config(&mut self, specs: Vec<ConfigJob>) {
        let names: Vec<String> = specs.iter().filter_map(|spec| spec.name.clone()).collect();
        let gone: Vec<String> = self
            .jobs
            .values()
            .filter(|job| job.source == JobSource::Config && !names.contains(&job.name))
            .map(|job| job.id.clone())
            .collect();
        for id in gone {
            tracing::info!(job = %id, "cron job removed from config.toml");
            if let Err(error) = self.remove(&id).await {
                tracing::warn!(job = %id, %error, "cron job not removed");
            }
        }
        for spec in specs {
            let Some(name) = spec.name.clone() else { continue };
            let existing = self
                .jobs
                .values()
                .find(|job| job.name == name)
                .map(|job| (job.id.clone(), job.source));
            let result = match existing {
                Some((id, JobSource::Config)) => {
                    self.update(&id, config_patch(spec), true).await.map(drop)
                }
                Some((id, JobSource::Api)) => {
                    Err(CronError::Invalid(format!("a job made over the API ({id}) has this name")))
                }
                None => self.add(spec, JobSource::Config).await.map(drop),
            };
            if let Err(error) = result {
                tracing::warn!(job = %name, %error, "cron job from config.toml not applied");
            }
        }
    }
}

/// A config job as an edit that sets every field (unset ones to their defaults).
fn config_patch(spec: JobSpec) -> JobPatch {
    JobPatch {
        name: spec.name,
        schedule: Some(spec.schedule),
        prompt: Some(spec.prompt),
        session_key: Some(spec.session_key.clone()),
        agent_id: Some(spec.agent_id.unwrap_or_else(|| default_agent(&spec.session_key))),
        memory_file: spec.memory_file,
        timezone: Some(spec.timezone.unwrap_or_else(|| DEFAULT_TIMEZONE.to_owned())),
        enabled: Some(spec.enabled.unwrap_or(true)),
        jitter_sec: Some(spec.jitter_sec.unwrap_or(0)),
        timeout_ms: Some(spec.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS)),
        max_retries: Some(spec.max_retries.unwrap_or(0)),
        retry_backoff_ms: Some(spec.retry_backoff_ms.unwrap_or(DEFAULT_RETRY_BACKOFF_MS)),
        meta: Some(spec.meta.unwrap_or(serde_json::Value::Null)),
    }
}

fn default_agent(session_key: &SessionKey) -> String {
    agent_of(session_key).unwrap_or(super::DEFAULT_AGENT).to_owned()
}

/// The checks every job passes, wherever it comes from.
fn checked(mut job: CronJob) -> Result<CronJob, CronError> {
    let schedule = Schedule::parse(&job.schedule)
        .map_err(|error| CronError::Schedule { schedule: job.schedule.clone(), error })?;
    job.schedule = schedule.expr().to_owned();
    parse_timezone(&job.timezone).map_err(|e| CronError::Invalid(format!("timezone: {e}")))?;
    job.name = job.name.trim().to_owned();
    if job.name.is_empty()
        || job.name.chars().any(char::is_control)
        || job.name.chars().count() > 200
    {
        return Err(CronError::Invalid(
            "name must be 1 to 200 characters without control characters".to_owned(),
        ));
    }
    if job.prompt.trim().is_empty() {
        return Err(CronError::Invalid("prompt must not be empty".to_owned()));
    }
    if job.jitter_sec > MAX_JITTER_SEC {
        return Err(CronError::Invalid(format!("jitterSec must be at most {MAX_JITTER_SEC}")));
    }
    if job.timeout_ms == 0 || job.timeout_ms > MAX_DURATION_MS {
        return Err(CronError::Invalid(format!("timeoutMs must be 1 to {MAX_DURATION_MS}")));
    }
    if job.max_retries > MAX_RETRIES {
        return Err(CronError::Invalid(format!("maxRetries must be at most {MAX_RETRIES}")));
    }
    if job.retry_backoff_ms > MAX_DURATION_MS {
        return Err(CronError::Invalid(format!(
            "retryBackoffMs must be at most {MAX_DURATION_MS}"
        )));
    }
    Ok(job)
}

/// A new job from `spec`, with the defaults for what it leaves unset.
///
/// # Errors
/// A field is invalid.
pub fn build_job(
    id: String,
    spec: JobSpec,
    source: JobSource,
    now_ms: i64,
) -> Result<CronJob, CronError> {
    let name = spec.name.unwrap_or_else(|| format!("Cron {}", truncate_plain(&spec.prompt, 32)));
    let agent_id = spec.agent_id.unwrap_or_else(|| default_agent(&spec.session_key));
    checked(CronJob {
        id,
        name,
        schedule: spec.schedule,
        prompt: spec.prompt,
        session_key: spec.session_key.as_str().to_owned(),
        agent_id,
        memory_file: spec.memory_file,
        timezone: spec.timezone.unwrap_or_else(|| DEFAULT_TIMEZONE.to_owned()),
        enabled: spec.enabled.unwrap_or(true),
        jitter_sec: spec.jitter_sec.unwrap_or(0),
        timeout_ms: spec.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        max_retries: spec.max_retries.unwrap_or(0),
        retry_backoff_ms: spec.retry_backoff_ms.unwrap_or(DEFAULT_RETRY_BACKOFF_MS),
        meta: spec.meta.unwrap_or(serde_json::Value::Null),
        source,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        last_run_at_ms: None,
        next_run_at_ms: None,
    })
}

fn truncate_plain(text: &str, limit: usize) -> String {
    text.trim().chars().take(limit).collect()
}

fn apply_patch(old: &CronJob, patch: JobPatch, now_ms: i64) -> Result<CronJob, CronError> {
    let mut job = old.clone();
    if let Some(v) = patch.name {
        job.name = v;
    }
    if let Some(v) = patch.schedule {
        job.schedule = v;
    }
    if let Some(v) = patch.prompt {
        job.prompt = v;
    }
    if let Some(v) = patch.session_key {
        job.session_key = v.as_str().to_owned();
    }
    if let Some(v) = patch.agent_id {
        job.agent_id = v;
    }
    if let Some(v) = patch.memory_file {
        job.memory_file = Some(v);
    }
    if let Some(v) = patch.timezone {
        job.timezone = v;
    }
    if let Some(v) = patch.enabled {
        job.enabled = v;
    }
    if let Some(v) = patch.jitter_sec {
        job.jitter_sec = v;
    }
    if let Some(v) = patch.timeout_ms {
        job.timeout_ms = v;
    }
    if let Some(v) = patch.max_retries {
        job.max_retries = v;
    }
    if let Some(v) = patch.retry_backoff_ms {
        job.retry_backoff_ms = v;
    }
    if let Some(v) = patch.meta {
        job.meta = v;
    }
    job.updated_at_ms = now_ms;
    checked(job)
}

/// The job's next firing after `now_ms`, plus a random jitter of up to
/// `jitter_sec`; `None` when disabled or when the schedule never fires again.
pub fn next_run(job: &CronJob, now_ms: i64) -> Option<i64> {
    if !job.enabled {
        return None;
    }
    let schedule = Schedule::parse(&job.schedule).ok()?;
    let tz = parse_timezone(&job.timezone).ok()?;
    let now = Utc.timestamp_millis_opt(now_ms).single()?;
    let at = schedule.next_after(&now, &tz)?.timestamp_millis();
    Some(at + jitter_ms(job.jitter_sec))
}

/// A random delay in `0..=jitter_sec` seconds, in milliseconds.
fn jitter_ms(jitter_sec: u64) -> i64 {
    if jitter_sec == 0 {
        return 0;
    }
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return 0;
    }
    let span = jitter_sec * 1000 + 1;
    i64::try_from(u64::from_le_bytes(bytes) % span).unwrap_or(0)
}

/// How one attempt ended.
enum Attempt {
    Succeeded(String),
    Failed(String),
    TimedOut,
    Aborted,
    /// The gateway is stopping; nothing more is recorded.
    ShuttingDown,
}

/// One firing of a job: its attempts, reported to the actor.
struct Firing {
    router: RouterHandle,
    clock: Arc<dyn WallClock>,
    tx: mpsc::Sender<CronMsg>,
    job: CronJob,
    run: CronRun,
    abort: CancellationToken,
    shutdown: CancellationToken,
}

impl Firing {
    async fn report(&self) {
        let _ = self.tx.send(CronMsg::Progress { run: self.run.clone() }).await;
    }

    async fn run(mut self) {
        loop {
            let router_run = RunId::generate();
            self.run.router_run_id = Some(router_run.to_string());
            self.run.status = CronRunStatus::Running;
            self.report().await;
            let (status, output) = match self.attempt(&router_run).await {
                Attempt::Succeeded(answer) => (CronRunStatus::Succeeded, answer),
                Attempt::Aborted => (CronRunStatus::Aborted, "aborted".to_owned()),
                Attempt::ShuttingDown => return,
                failed @ (Attempt::Failed(_) | Attempt::TimedOut) => {
                    let (status, output) = match failed {
                        Attempt::Failed(error) => (CronRunStatus::Failed, error),
                        _ => (
                            CronRunStatus::TimedOut,
                            format!("timed out after {} ms", self.job.timeout_ms),
                        ),
                    };
                    if self.run.attempt <= self.job.max_retries {
                        self.run.status = CronRunStatus::Retrying;
                        self.run.output = Some(truncate(&output, OUTPUT_LIMIT));
                        self.report().await;
                        let doublings = (self.run.attempt - 1).min(20);
                        let backoff = self
                            .job
                            .retry_backoff_ms
                            .saturating_mul(1 << doublings)
                            .min(MAX_BACKOFF_MS);
                        tokio::select! {
                            () = sleep(Duration::from_millis(backoff)) => {}
                            () = self.abort.cancelled() => {
                                if self.shutdown.is_cancelled() {
                                    return;
                                }
                                self.finish(CronRunStatus::Aborted, "aborted".to_owned()).await;
                                return;
                            }
                        }
                        self.run.attempt += 1;
                        continue;
                    }
                    (status, output)
                }
            };
            self.finish(status, output).await;
            return;
        }
    }

    async fn finish(&mut self, status: CronRunStatus, output: String) {
        self.run.status = status;
        self.run.output = Some(truncate(&output, OUTPUT_LIMIT));
        self.run.ended_at_ms = Some(self.clock.now_ms());
        self.report().await;
    }

    async fn attempt(&self, router_run: &RunId) -> Attempt {
        let mut req = RunRequest::new(
            SessionKey::from(self.job.session_key.as_str()),
            self.job.prompt.clone(),
        );
        req.origin = Origin::Cron;
        req.agent_id = Some(self.job.agent_id.clone());
        req.run_id = Some(router_run.clone());
        req.meta.insert("cron_job_id".to_owned(), self.job.id.clone().into());
        req.meta.insert("cron_run_id".to_owned(), self.run.id.clone().into());
        let mut follower = match self.router.submit(req).await {
            Ok(Submitted::Run(_, follower)) => follower,
            Ok(Submitted::Command { reply, .. }) => return Attempt::Succeeded(reply),
            Err(error) => return Attempt::Failed(format!("not accepted: {error}")),
        };
        let mut streamed = String::new();
        let ending = async {
            while let Some(event) = follower.next().await {
                let Some(event) = event.event() else { continue };
                match &event.kind {
                    EventKind::Delta { text, .. } => streamed.push_str(text),
                    EventKind::RunCompleted { completion, .. } => return Some(completion.clone()),
                    _ => {}
                }
            }
            None
        };
        let limit = Duration::from_millis(self.job.timeout_ms);
        let ended = tokio::select! {
            ended = timeout(limit, ending) => ended,
            () = self.abort.cancelled() => {
                if self.shutdown.is_cancelled() {
                    return Attempt::ShuttingDown;
                }
                let _ = self.router.cancel_run(router_run).await;
                return Attempt::Aborted;
            }
        };
        match ended {
            Ok(Some(completion)) if completion.ok => {
                let answer =
                    if completion.answer.is_empty() { streamed } else { completion.answer };
                Attempt::Succeeded(answer.trim().to_owned())
            }
            Ok(Some(completion)) => Attempt::Failed(match completion.error {
                Some(error) => error.to_string(),
                None => "the run failed".to_owned(),
            }),
            Ok(None) => Attempt::ShuttingDown,
            Err(_) => {
                let _ = self.router.cancel_run(router_run).await;
                Attempt::TimedOut
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
