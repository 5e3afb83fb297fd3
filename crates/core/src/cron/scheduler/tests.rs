//! The actor under paused time, over the real router and gateway with a fake
//! engine; the wall clock follows tokio's.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;
use crate::bus::EventBus;
use crate::cron::jobs::CronJobs;
use crate::engine::EngineRegistry;
use crate::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use crate::router::{RouterConfig, RouterHandle};
use crate::store::StoreHandle;
use crate::testing::{within_for, FakeEngine};

/// Waits here span virtual hours; still bounded.
const PATIENCE: Duration = Duration::from_secs(2 * 24 * 3600);

async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    within_for(PATIENCE, what, fut).await
}

/// 2026-03-02T08:00:00Z, a Monday.
pub(crate) const BASE_MS: i64 = 1_772_438_400_000;
const MINUTE: i64 = 60_000;

/// Wall time that starts at `base_ms` and moves with tokio's clock.
#[derive(Debug)]
pub(crate) struct TokioClock {
    base_ms: i64,
    start: Instant,
}

impl TokioClock {
    pub(crate) fn new(base_ms: i64) -> Arc<Self> {
        Arc::new(TokioClock { base_ms, start: Instant::now() })
    }
}

impl WallClock for TokioClock {
    fn now_ms(&self) -> i64 {
        self.base_ms + i64::try_from(self.start.elapsed().as_millis()).unwrap()
    }
}

pub(crate) struct Harness {
    pub(crate) cron: CronHandle,
    pub(crate) router: RouterHandle,
    pub(crate) fake: FakeEngine,
    pub(crate) store: StoreHandle,
    pub(crate) clock: Arc<TokioClock>,
    pub(crate) updates: broadcast::Receiver<CronRun>,
    token: CancellationToken,
    tracker: TaskTracker,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

pub(crate) async fn harness() -> Harness {
    harness_with(StoreHandle::memory(), Vec::new(), BASE_MS).await
}

pub(crate) async fn harness_with(
    store: StoreHandle,
    config: Vec<ConfigJob>,
    base_ms: i64,
) -> Harness {
    let fake = FakeEngine::new("fake");
    let mut engines = EngineRegistry::new();
    engines.register(Arc::new(fake.clone())).unwrap();
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let runtime = RuntimeConfig { max_concurrent_runs: 4, ..RuntimeConfig::default() };
    let bus = EventBus::new(65_536, 1024);
    let deps = GatewayDeps { config: runtime, engines, store: store.clone(), bus };
    let gateway = GatewayHandle::start(deps, token.clone(), &tracker);
    let config_router =
        RouterConfig { default_engine: "fake".parse().unwrap(), ..RouterConfig::default() };
    let router = RouterHandle::start(config_router, gateway, token.clone(), &tracker);
    let clock = TokioClock::new(base_ms);
    let deps = CronDeps { router: router.clone(), store: store.clone(), clock: clock.clone() };
    let cron = CronHandle::start(deps, config, token.clone(), &tracker);
    let updates = cron.subscribe_runs();
    Harness { cron, router, fake, store, clock, updates, token, tracker }
}

impl Harness {
    /// Stops the actor and everything under it, and waits until it has stopped.
    pub(crate) async fn stop(self) -> StoreHandle {
        self.token.cancel();
        self.tracker.close();
        within("the cron actor stops", self.tracker.wait()).await;
        self.store.clone()
    }

    /// The next change of a run that has ended.
    pub(crate) async fn ended(&mut self) -> CronRun {
        within("a cron run ends", async {
            loop {
                let run = self.updates.recv().await.unwrap();
                if !run.status.is_active() {
                    return run;
                }
            }
        })
        .await
    }

    /// The next change of a run, with the wall time it arrived at.
    async fn update(&mut self) -> (CronRun, i64) {
        let run = within("a cron run changes", self.updates.recv()).await.unwrap();
        (run, self.clock.now_ms())
    }
}

pub(crate) fn spec(schedule: &str, prompt: &str) -> JobSpec {
    JobSpec::new(schedule, prompt, SessionKey::from("agent:ops:main"))
}

#[tokio::test(start_paused = true)]
async fn jobs_fire_on_schedule_through_the_router() {
    let mut h = harness().await;
    let job = h.cron.add(spec("* * * * *", "ok hello cron")).await.unwrap();
    assert_eq!(job.next_run_at_ms, Some(BASE_MS + MINUTE));
    assert_eq!(job.agent_id, "ops");
    assert_eq!(job.name, "Cron ok hello cron");
    for n in 1..=3 {
        let run = h.ended().await;
        assert_eq!(run.status, CronRunStatus::Succeeded);
        assert_eq!(run.trigger, Trigger::Schedule);
        assert_eq!(run.output.as_deref(), Some("hello cron"));
        assert_eq!(run.started_at_ms, BASE_MS + n * MINUTE, "firing {n}");
        let routed = h
            .router
            .query()
            .get(&RunId::parse(run.router_run_id.as_deref().unwrap()).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(routed.session_key.as_str(), "agent:ops:main");
    }
    assert_eq!(h.fake.started().len(), 3);
    let runs = h.cron.runs(&job.id).await.unwrap();
    assert_eq!(runs.len(), 3);
    assert!(runs[0].started_at_ms > runs[2].started_at_ms, "newest first");
    let job = h.cron.get(&job.id).await.unwrap();
    assert_eq!(job.last_run_at_ms, Some(BASE_MS + 3 * MINUTE));
    assert_eq!(job.next_run_at_ms, Some(BASE_MS + 4 * MINUTE));
}

#[tokio::test(start_paused = true)]
async fn jitter_delays_a_firing_within_its_bound() {
    let mut h = harness().await;
    let mut job = spec("* * * * *", "ok j");
    job.jitter_sec = Some(20);
    let job = h.cron.add(job).await.unwrap();
    let mut slot = BASE_MS + MINUTE;
    let mut planned = job.next_run_at_ms.unwrap();
    for _ in 0..5 {
        assert!((slot..=slot + 20_000).contains(&planned), "{planned} not within 20 s of {slot}");
        let run = h.ended().await;
        assert_eq!(run.started_at_ms, planned);
        let next = h.cron.get(&job.id).await.unwrap().next_run_at_ms.unwrap();
        slot += MINUTE;
        planned = next;
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_past_its_timeout_is_cancelled() {
    let mut h = harness().await;
    let mut job = spec("@daily", "hang");
    job.timeout_ms = Some(1_500);
    let job = h.cron.add(job).await.unwrap();
    let started = h.cron.trigger(&job.id).await.unwrap();
    assert_eq!(started.trigger, Trigger::Manual);
    let run = h.ended().await;
    assert_eq!(run.id, started.id);
    assert_eq!(run.status, CronRunStatus::TimedOut);
    assert_eq!(run.output.as_deref(), Some("timed out after 1500 ms"));
    assert_eq!(run.ended_at_ms.unwrap() - run.started_at_ms, 1_500);
    let router_run = RunId::parse(run.router_run_id.as_deref().unwrap()).unwrap();
    let completed =
        within("the router run completes", h.router.follow(&router_run).completion()).await;
    let EventKind::RunCompleted { completion, .. } = &completed.unwrap().kind else {
        unreachable!()
    };
    assert_eq!(completion.error, Some(crate::engine::RunError::UserRequested));
    assert_eq!(h.fake.running(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_run_is_retried_with_doubling_backoff() {
    let mut h = harness().await;
    // Some text before the failure: a zero-answer retry does not apply.
    let mut job = spec("@daily", "fail partly");
    job.max_retries = Some(2);
    job.retry_backoff_ms = Some(1_000);
    let job = h.cron.add(job).await.unwrap();
    h.cron.trigger(&job.id).await.unwrap();
    let mut seen = Vec::new();
    loop {
        let (run, at) = h.update().await;
        seen.push((run.status, run.attempt, at - BASE_MS));
        if !run.status.is_active() {
            assert_eq!(run.output.as_deref(), Some("boom"));
            break;
        }
    }
    use CronRunStatus::{Failed, Retrying, Running};
    assert_eq!(
        seen,
        [
            (Running, 1, 0),
            (Retrying, 1, 0),
            (Running, 2, 1_000),
            (Retrying, 2, 1_000),
            (Running, 3, 3_000),
            (Failed, 3, 3_000)
        ]
    );
    assert_eq!(h.fake.started(), ["fail partly", "fail partly", "fail partly"]);
}

#[tokio::test(start_paused = true)]
async fn an_aborted_run_stops_and_is_not_retried() {
    let mut h = harness().await;
    let mut job = spec("@daily", "hang");
    job.max_retries = Some(3);
    let job = h.cron.add(job).await.unwrap();
    let run = h.cron.trigger(&job.id).await.unwrap();
    // Wait until its router run exists.
    let (running, _) = h.update().await;
    assert!(running.router_run_id.is_some());
    let aborted = h.cron.abort(&run.id).await.unwrap();
    assert_eq!(aborted.status, CronRunStatus::Aborted);
    assert_eq!(aborted.router_run_id, running.router_run_id);
    let ended = h.ended().await;
    assert_eq!(ended.status, CronRunStatus::Aborted);
    assert_eq!(h.cron.abort(&run.id).await, Err(CronError::RunNotActive { id: run.id.clone() }));
    assert_eq!(
        h.cron.abort("cronrun_nope").await,
        Err(CronError::RunNotFound { id: "cronrun_nope".to_owned() })
    );
    assert_eq!(h.fake.started(), ["hang"]);
}

#[tokio::test(start_paused = true)]
async fn a_slot_missed_while_down_fires_once_at_start() {
    let store = StoreHandle::memory();
    let h = harness_with(store.clone(), Vec::new(), BASE_MS).await;
    let job = h.cron.add(spec("every 5m", "ok catch up")).await.unwrap();
    let store = h.stop().await;
    // The gateway comes back three hours later: 36 slots were missed.
    let later = BASE_MS + 180 * MINUTE;
    let mut h = harness_with(store, Vec::new(), later).await;
    let run = h.ended().await;
    assert_eq!(run.started_at_ms, later);
    assert_eq!(run.output.as_deref(), Some("catch up"));
    let job = h.cron.get(&job.id).await.unwrap();
    assert_eq!(job.next_run_at_ms, Some(later + 5 * MINUTE));
    assert_eq!(h.fake.started(), ["ok catch up"]);
    let status = h.cron.status().await.unwrap();
    assert_eq!(
        (status.job_count, status.active_jobs, status.next_run_at_ms),
        (1, 1, Some(later + 5 * MINUTE))
    );
}

#[tokio::test(start_paused = true)]
async fn jobs_survive_a_restart_and_interrupted_runs_are_recorded_failed() {
    let h = harness().await;
    let job = h.cron.add(spec("@daily", "ok")).await.unwrap();
    let paused =
        JobSpec { enabled: Some(false), name: Some("off".to_owned()), ..spec("@hourly", "ok") };
    let paused = h.cron.add(paused).await.unwrap();
    assert_eq!(paused.next_run_at_ms, None);
    let store = h.stop().await;
    // A gateway killed during a run leaves the run's record going.
    let left = CronRun {
        id: "cronrun_left".to_owned(),
        job_id: job.id.clone(),
        router_run_id: Some("run_left".to_owned()),
        status: CronRunStatus::Running,
        trigger: Trigger::Schedule,
        attempt: 1,
        started_at_ms: BASE_MS,
        ended_at_ms: None,
        output: None,
    };
    CronJobs::new(store.clone()).put_run(&left).await.unwrap();
    let h = harness_with(store, Vec::new(), BASE_MS + MINUTE).await;
    let jobs = h.cron.list().await.unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(h.cron.get(&job.id).await.unwrap(), job);
    assert_eq!(h.cron.get(&paused.id).await.unwrap().next_run_at_ms, None);
    let runs = h.cron.runs(&job.id).await.unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, CronRunStatus::Failed);
    assert_eq!(runs[0].ended_at_ms, Some(BASE_MS + MINUTE));
    assert_eq!(runs[0].output.as_deref(), Some("interrupted: the gateway stopped during the run"));
}

#[tokio::test(start_paused = true)]
async fn updates_recompute_the_next_firing_and_bad_values_are_refused() {
    let h = harness().await;
    let job = h.cron.add(spec("daily at 9am", "ok")).await.unwrap();
    assert_eq!(job.next_run_at_ms, Some(BASE_MS + 60 * MINUTE));
    let patch = JobPatch {
        schedule: Some("every 2h".to_owned()),
        timezone: Some("Asia/Kolkata".to_owned()),
        ..JobPatch::default()
    };
    let job = h.cron.update(&job.id, patch).await.unwrap();
    assert_eq!(job.schedule, "0 */2 * * *");
    // 08:00 UTC is 13:30 in Kolkata: the next even hour there is 14:00, 08:30 UTC.
    assert_eq!(job.next_run_at_ms, Some(BASE_MS + 30 * MINUTE));
    let paused = h
        .cron
        .update(&job.id, JobPatch { enabled: Some(false), ..JobPatch::default() })
        .await
        .unwrap();
    assert_eq!(paused.next_run_at_ms, None);
    let resumed = h
        .cron
        .update(&job.id, JobPatch { enabled: Some(true), ..JobPatch::default() })
        .await
        .unwrap();
    assert_eq!(resumed.next_run_at_ms, Some(BASE_MS + 30 * MINUTE));

    let bad = h
        .cron
        .update(
            &job.id,
            JobPatch { schedule: Some("61 * * * *".to_owned()), ..JobPatch::default() },
        )
        .await;
    assert_eq!(
        bad.unwrap_err().to_string(),
        "invalid schedule \"61 * * * *\": minute field `61`: 61 is out of range 0-59"
    );
    let bad =
        h.cron.add(JobSpec { timezone: Some("Nowhere".to_owned()), ..spec("@daily", "x") }).await;
    assert!(bad.unwrap_err().to_string().starts_with("timezone: unknown time zone `Nowhere`"));
    let bad = h.cron.add(JobSpec { timeout_ms: Some(0), ..spec("@daily", "x") }).await;
    assert_eq!(bad.unwrap_err().to_string(), "timeoutMs must be 1 to 2592000000");
    let bad = h.cron.add(JobSpec { name: Some(job.name.clone()), ..spec("@daily", "x") }).await;
    assert_eq!(bad.unwrap_err(), CronError::DuplicateName { name: job.name.clone() });
    assert_eq!(
        h.cron.get("cron_nope").await,
        Err(CronError::NotFound { id: "cron_nope".to_owned() })
    );
    assert_eq!(h.cron.remove(&job.id).await.unwrap().id, job.id);
    assert!(h.cron.list().await.unwrap().is_empty());
    assert!(CronJobs::new(h.store.clone()).runs(&job.id).await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn config_jobs_follow_the_file_by_name() {
    let config_job = |name: &str, schedule: &str| JobSpec {
        name: Some(name.to_owned()),
        ..spec(schedule, "ok from config")
    };
    let h = harness_with(
        StoreHandle::memory(),
        vec![config_job("a", "@daily"), config_job("b", "@hourly")],
        BASE_MS,
    )
    .await;
    let api = h
        .cron
        .add(JobSpec { name: Some("mine".to_owned()), ..spec("@daily", "ok") })
        .await
        .unwrap();
    let jobs = h.cron.list().await.unwrap();
    let a = jobs.iter().find(|job| job.name == "a").unwrap().clone();
    assert_eq!(a.source, JobSource::Config);
    assert_eq!(jobs.len(), 3);

    // Fields of a config job are the file's; pausing it is fine.
    let edit = h
        .cron
        .update(&a.id, JobPatch { prompt: Some("x".to_owned()), ..JobPatch::default() })
        .await;
    assert_eq!(edit, Err(CronError::ConfigJob { id: a.id.clone() }));
    h.cron.update(&a.id, JobPatch { enabled: Some(false), ..JobPatch::default() }).await.unwrap();

    // `a` changes schedule and keeps its id, `b` is gone, `c` is new, `mine` stays.
    h.cron.sync_config(vec![config_job("a", "every 2h"), config_job("c", "@daily")]).await.unwrap();
    let jobs = h.cron.list().await.unwrap();
    let names: Vec<&str> = jobs.iter().map(|job| job.name.as_str()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    let a2 = jobs.iter().find(|job| job.name == "a").unwrap();
    assert_eq!(
        (a2.id.as_str(), a2.schedule.as_str(), a2.enabled),
        (a.id.as_str(), "0 */2 * * *", true)
    );
    assert!(jobs.iter().any(|job| job.name == "c" && job.source == JobSource::Config));
    assert!(jobs.iter().any(|job| job.id == api.id));

    // A config job may not take the name of an API job.
    h.cron.sync_config(vec![config_job("mine", "@hourly")]).await.unwrap();
    let jobs = h.cron.list().await.unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, api.id);
    assert_eq!(jobs[0].schedule, "0 0 * * *");
}

/// In a cluster every node answers for the jobs, and only the one holding the
/// cron lease fires them: a job added on a follower fires once a minute on
/// the leader, and after the lead moves, on the new leader alone.
#[tokio::test(start_paused = true)]
async fn in_a_cluster_only_the_leading_node_fires_and_sees_jobs_added_elsewhere() {
    let h = harness().await;
    let start = |leader: watch::Receiver<bool>| {
        let deps =
            CronDeps { router: h.router.clone(), store: h.store.clone(), clock: h.clock.clone() };
        CronHandle::start_led(deps, Vec::new(), Some(leader), h.token.clone(), &h.tracker)
    };
    let (lead_a, leader_a) = watch::channel(true);
    let (lead_b, leader_b) = watch::channel(false);
    let a = start(leader_a);
    let b = start(leader_b);
    let mut runs_a = a.subscribe_runs();
    let mut runs_b = b.subscribe_runs();
    // (The harness's own actor reads the store only at start: it never
    // learns of the job.)
    let job = b.add(spec("* * * * *", "ok from b")).await.unwrap();
    let ended = |runs: &mut broadcast::Receiver<CronRun>| {
        let mut runs = runs.resubscribe();
        let job_id = job.id.clone();
        async move {
            loop {
                let run = runs.recv().await.unwrap();
                if !run.status.is_active() && run.job_id == job_id {
                    return run;
                }
            }
        }
    };
    let first = within("the leader fires the job", ended(&mut runs_a)).await;
    assert_eq!(first.status, CronRunStatus::Succeeded);
    assert!(runs_b.try_recv().is_err(), "the follower fired nothing");

    lead_a.send_replace(false);
    lead_b.send_replace(true);
    let second = within("the new leader fires the job", ended(&mut runs_b)).await;
    assert_eq!(second.status, CronRunStatus::Succeeded);
    assert!(second.started_at_ms > first.started_at_ms);
    let runs = b.runs(&job.id).await.unwrap();
    let mut starts: Vec<i64> = runs.iter().map(|r| r.started_at_ms / MINUTE).collect();
    starts.sort_unstable();
    let mut distinct = starts.clone();
    distinct.dedup();
    assert_eq!(starts.len(), distinct.len(), "no minute fired twice: {starts:?}");
}
