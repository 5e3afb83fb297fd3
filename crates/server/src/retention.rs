//! Retention: `[gateway.retention]` applied by a background task, in steps
//! small enough that a run's writes never wait long behind one.
//!
//! A pass runs at start, every [`PASS_EVERY`], and at once when the section
//! is edited (hot reload). It deletes before it rewrites, so a full disk gets
//! room first: expired records, the oldest finished runs while the file is
//! past `max_db_mb`, runs past `runs_days`, usage past `usage_days`, native
//! sessions unused for `sessions_days`, cron history past `cron_runs_kept`;
//! then it compacts the events of runs past `events_days`, and gives the
//! freed pages back to the file system. A step that fails ends the pass (the
//! next one is [`RETRY_AFTER`] later), so a store that cannot write is never
//! asked for more. Between two passes the file's size is looked at every
//! [`SIZE_CHECK_EVERY`], so `max_db_mb` holds under sustained load.
//!
//! Each step removes at most `limit` rows; the limit doubles while a step
//! takes under [`STEP_AIM`] and halves above twice it, and the task waits
//! [`PAUSE_PER_STEP`] times as long as a step took before the next, so it
//! has the writer (and a core) a quarter of the time at most. Short steps
//! matter more than the pause: on a machine of two cores, beside a load of
//! 1 000 runs a second (p99 0.41–0.53 ms alone), a pass over 200 000 old runs
//! moved the p99 to 1.6–2.1 ms with 2 ms steps and as long a pause, to
//! 1.2–1.5 ms with 1 ms steps, and to 0.51–0.72 ms with these; the median
//! stays where it was (`lemon-bench latency-prune`). Such a pass takes three
//! to four minutes; a day's worth of runs, seconds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use lemon_core::config::RetentionConfig;
use lemon_core::cron::jobs::CronJobs;
use lemon_core::store::upkeep::{PrunePass, Upkeep};
use lemon_core::store::{PruneStep, StoreError, StoreHandle};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often a whole pass runs.
pub const PASS_EVERY: Duration = Duration::from_secs(10 * 60);
/// How soon a pass that failed is tried again.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);
/// How often the file's size is checked against `max_db_mb` between passes.
pub const SIZE_CHECK_EVERY: Duration = Duration::from_secs(10);
/// How long one step should hold the writer.
pub const STEP_AIM: Duration = Duration::from_micros(250);
/// The pause after a step, in multiples of the time it took.
pub const PAUSE_PER_STEP: u32 = 3;
/// The first and the largest number of rows of a step.
const FIRST_LIMIT: usize = 16;
const MAX_LIMIT: usize = 1024;
/// Pages given back per vacuum step (4 MiB of 4 KiB pages).
const VACUUM_PAGES: u32 = 1024;
/// Share of `max_db_mb` a file past it is brought back under.
const SHRINK_TO_PERCENT: u64 = 90;

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// What retention works on.
#[derive(Debug, Clone)]
pub struct Retention {
    pub store: StoreHandle,
    /// The SQLite file, whose free pages vacuum gives back; `None`: a store
    /// in memory or in PostgreSQL (whose autovacuum does that).
    pub database: Option<PathBuf>,
    /// Where each pass is recorded.
    pub upkeep: Upkeep,
    /// Received files waiting for their run: those older than
    /// [`STAGED_FILES_KEPT`] are removed by each pass.
    pub media: Option<lemon_core::media::MediaStage>,
}

/// How long a received file waits in the stage for its run before a pass
/// removes it (its request was refused, or ended before it ran).
pub const STAGED_FILES_KEPT: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// A pass in progress: what it removed so far and each step's row limit.
#[derive(Debug, Default)]
struct Pass {
    removed: BTreeMap<&'static str, u64>,
    limit: BTreeMap<&'static str, usize>,
}

/// The moment `days` days before `now_ms`; `None` when `days` is 0 (kept forever).
fn days_before(now_ms: i64, days: u32) -> Option<i64> {
    (days > 0).then(|| now_ms.saturating_sub(i64::from(days).saturating_mul(DAY_MS)))
}

impl Retention {
    /// One whole pass under `config` at `now_ms`, recorded in [`Upkeep`].
    pub async fn pass(&self, config: &RetentionConfig, now_ms: i64) -> PrunePass {
        let started = Instant::now();
        let mut pass = Pass::default();
        let outcome = self.steps(config, now_ms, &mut pass).await;
        let record = PrunePass {
            at_ms: lemon_core::clock::now_ms(),
            took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            removed: pass.removed.into_iter().filter(|(_, n)| *n > 0).collect(),
            error: outcome.err().map(|err| err.to_string()),
        };
        match &record.error {
            Some(error) => {
                tracing::warn!(%error, removed = ?record.removed, "store retention pass stopped; trying again in a minute")
            }
            None if record.removed.is_empty() => {
                tracing::debug!("store retention pass: nothing to remove")
            }
            None => {
                tracing::info!(removed = ?record.removed, took_ms = record.took_ms, "store retention pass")
            }
        }
        self.upkeep.pruned(record.clone());
        record
    }

    async fn steps(
        &self,
        config: &RetentionConfig,
        now_ms: i64,
        pass: &mut Pass,
    ) -> Result<(), StoreError> {
        self.until_done(pass, |limit| PruneStep::ExpiredRecords { now_ms, limit }).await?;
        self.bound_size(config, pass).await?;
        if let Some(before_ms) = days_before(now_ms, config.runs_days) {
            self.until_done(pass, |limit| PruneStep::Runs { before_ms, limit }).await?;
        }
        if let Some(before_ms) = days_before(now_ms, config.usage_days) {
            self.until_done(pass, |limit| PruneStep::Usage { before_ms, limit }).await?;
        }
        if let Some(before_ms) = days_before(now_ms, config.sessions_days) {
            let namespace = lemon_engines::native::session::NAMESPACE.to_owned();
            self.until_done(pass, |limit| PruneStep::IdleRecords {
                namespace: namespace.clone(),
                before_ms,
                limit,
            })
            .await?;
        }
        if let Some(stage) = self.media.clone() {
            let swept = tokio::task::spawn_blocking(move || stage.sweep(STAGED_FILES_KEPT));
            *pass.removed.entry("staged_files").or_default() += swept.await.unwrap_or(0) as u64;
        }
        let kept = usize::try_from(config.cron_runs_kept).unwrap_or(usize::MAX);
        let trimmed = CronJobs::new(self.store.clone()).trim_runs(kept).await?;
        *pass.removed.entry("cron_runs").or_default() += trimmed;
        if let Some(before_ms) = days_before(now_ms, config.events_days) {
            self.until_done(pass, |limit| PruneStep::Events { before_ms, limit }).await?;
        }
        self.vacuum(pass).await
    }

    /// The size check between passes: brings a file past `max_db_mb` back
    /// under its bound, and gives freed pages back.
    ///
    /// # Errors
    /// A step failed (the store is closed or cannot write).
    pub async fn check_size(&self, config: &RetentionConfig) -> Result<(), StoreError> {
        let mut pass = Pass::default();
        let outcome = self.bound_size(config, &mut pass).await;
        if pass.removed.values().any(|n| *n > 0) {
            self.vacuum(&mut pass).await?;
            let removed: BTreeMap<_, _> =
                pass.removed.into_iter().filter(|(_, n)| *n > 0).collect();
            tracing::info!(?removed, "store past max_db_mb: oldest finished runs removed");
            self.upkeep.pruned(PrunePass {
                at_ms: lemon_core::clock::now_ms(),
                removed,
                error: outcome.as_ref().err().map(ToString::to_string),
                ..PrunePass::default()
            });
        }
        outcome
    }

    /// While the store's pages in use pass `max_db_mb`, the oldest finished
    /// runs go (and their free pages with them) until it is under 90 % of it.
    async fn bound_size(
        &self,
        config: &RetentionConfig,
        pass: &mut Pass,
    ) -> Result<(), StoreError> {
        let Some(max_mb) = config.max_db_mb else { return Ok(()) };
        let bound = max_mb.saturating_mul(1_000_000);
        if self.store.retention().used_bytes().await? <= bound {
            return Ok(());
        }
        let target = bound / 100 * SHRINK_TO_PERCENT;
        loop {
            let removed =
                self.step(pass, |limit| PruneStep::Runs { before_ms: i64::MAX, limit }).await?;
            if removed == 0 || self.store.retention().used_bytes().await? <= target {
                return Ok(());
            }
        }
    }

    /// Gives every free page back, a slice at a time.
    async fn vacuum(&self, pass: &mut Pass) -> Result<(), StoreError> {
        if self.database.is_none() {
            return Ok(());
        }
        while self.step(pass, |_| PruneStep::Vacuum { pages: VACUUM_PAGES }).await?
            >= u64::from(VACUUM_PAGES)
        {}
        Ok(())
    }

    /// Repeats a step until it removes less than its limit.
    async fn until_done(
        &self,
        pass: &mut Pass,
        step: impl Fn(usize) -> PruneStep,
    ) -> Result<(), StoreError> {
        loop {
            let kind = step(0).kind();
            let limit = *pass.limit.get(kind).unwrap_or(&FIRST_LIMIT);
            let removed = self.step(pass, &step).await?;
            if removed < limit as u64 {
                return Ok(());
            }
        }
    }

    /// One step with the kind's current limit; adapts the limit to how long
    /// it took, then waits as long before returning.
    async fn step(
        &self,
        pass: &mut Pass,
        step: impl Fn(usize) -> PruneStep,
    ) -> Result<u64, StoreError> {
        let kind = step(0).kind();
        let limit = pass.limit.entry(kind).or_insert(FIRST_LIMIT);
        let started = Instant::now();
        let removed = self.store.retention().prune(step(*limit)).await?;
        let took = started.elapsed();
        if took < STEP_AIM {
            *limit = (*limit * 2).min(MAX_LIMIT);
        } else if took > STEP_AIM * 2 {
            *limit = (*limit / 2).max(1);
        }
        *pass.removed.entry(kind).or_default() += removed;
        tokio::time::sleep(took * PAUSE_PER_STEP).await;
        Ok(removed)
    }
}

/// Runs passes until `shutdown`: at start, every [`PASS_EVERY`] (or
/// [`RETRY_AFTER`] a failed one), and when `config` changes; checks the size
/// every [`SIZE_CHECK_EVERY`] in between.
pub async fn run(
    retention: Retention,
    mut config: watch::Receiver<RetentionConfig>,
    shutdown: CancellationToken,
) {
    let mut next_pass = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_pass {
            let current = config.borrow_and_update().clone();
            let pass = retention.pass(&current, lemon_core::clock::now_ms()).await;
            let wait = if pass.error.is_some() { RETRY_AFTER } else { PASS_EVERY };
            next_pass = Instant::now() + wait;
            continue;
        }
        let wake = (now + SIZE_CHECK_EVERY).min(next_pass);
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = config.changed() => {
                if changed.is_err() {
                    return;
                }
                tracing::info!("[gateway.retention] edited: a retention pass runs now");
                next_pass = Instant::now();
            }
            () = tokio::time::sleep_until(wake) => {
                if wake < next_pass {
                    let current = config.borrow().clone();
                    if let Err(error) = retention.check_size(&current).await {
                        tracing::warn!(%error, "store size check failed");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
