//! The [`BudgetGuard`] of the gateway: limits from `[gateway.budgets]`, the
//! run's binding and the session's own override (kept in the store's `kv`),
//! checked against what the store says finished runs spent today (UTC) plus
//! what the running run has used so far.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use foldhash::fast::RandomState;

use super::usage::{ReportedUsage, RunSpend};
use super::{BudgetExceeded, BudgetGuard, BudgetScope, TokenUsage};
use crate::clock::now_ms;
use crate::config::{BudgetLimits, BudgetsConfig, SessionLimits};
use crate::ids::{RunId, SessionKey};
use crate::store::{StoreError, StoreHandle, UsageFilter, UsageTotals};

/// The `kv` namespace of the sessions' own limits (`PUT /v1/sessions/{key}/budget`).
pub const SESSION_BUDGETS_NAMESPACE: &str = "session_budgets";

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// The start of the UTC day that `ms` falls in.
pub fn utc_day_start(ms: i64) -> i64 {
    ms - ms.rem_euclid(DAY_MS)
}

/// What a session spent today against its limits.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SessionBudget {
    /// The limits in force (the session's, its binding's, then the global ones).
    pub limits: BudgetLimits,
    /// The session's own override, if it has one.
    pub session_override: Option<SessionLimits>,
    /// The session's finished runs since the start of the UTC day.
    pub session_today: UsageTotals,
    /// Every session's finished runs since the start of the UTC day.
    pub all_today: UsageTotals,
    /// The start of that day, ms since the epoch.
    pub day_start_ms: i64,
}

type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The guard over the store. One lives as long as the gateway; a reload that
/// changes `[gateway.budgets]` gives it the new limits and prices.
pub struct StoreBudgetGuard {
    store: StoreHandle,
    /// The config in force; replaced whole on reload.
    config: RwLock<Arc<BudgetsConfig>>,
    /// The binding limits of runs between `admit` and `finish`.
    admitted: Mutex<HashMap<RunId, SessionLimits, RandomState>>,
    /// Wall-clock milliseconds: what "today" is.
    now_ms: Clock,
    /// Whether any session's own limits may be in the store: [`UNKNOWN`] until
    /// the first lookup lists them, [`SOME`] from the first
    /// [`StoreBudgetGuard::set_session_limits`] on. While it is [`NONE`], a
    /// check (before every run and every native model turn) reads nothing.
    stored_limits: AtomicU8,
}

const UNKNOWN: u8 = 0;
const NONE: u8 = 1;
const SOME: u8 = 2;

impl fmt::Debug for StoreBudgetGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreBudgetGuard").field("config", &*self.config()).finish_non_exhaustive()
    }
}

impl StoreBudgetGuard {
    pub fn new(store: StoreHandle, config: BudgetsConfig) -> Self {
        StoreBudgetGuard {
            store,
            config: RwLock::new(Arc::new(config)),
            admitted: Mutex::default(),
            now_ms: Arc::new(now_ms),
            stored_limits: AtomicU8::new(UNKNOWN),
        }
    }

    /// The same guard reading the time from `now_ms` (tests fix the clock).
    pub fn with_clock(mut self, now_ms: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.now_ms = Arc::new(now_ms);
        self
    }

    /// The store the guard reads (usage totals for `/v1/usage`).
    pub fn store(&self) -> &StoreHandle {
        &self.store
    }

    /// The config in force.
    pub fn config(&self) -> Arc<BudgetsConfig> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts an edited `[gateway.budgets]` in force for every later check.
    pub fn reconfigure(&self, config: BudgetsConfig) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    /// The session's own limits, if it set any.
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn session_limits(
        &self,
        session_key: &SessionKey,
    ) -> Result<Option<SessionLimits>, StoreError> {
        match self.stored_limits.load(Ordering::Acquire) {
            NONE => return Ok(None),
            UNKNOWN => {
                let any = !self.store.kv_list(SESSION_BUDGETS_NAMESPACE, 0).await?.is_empty();
                // A session's limits set meanwhile have already said `SOME`.
                let seen = if any { SOME } else { NONE };
                let _ = self.stored_limits.compare_exchange(
                    UNKNOWN,
                    seen,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                if !any && self.stored_limits.load(Ordering::Acquire) == NONE {
                    return Ok(None);
                }
            }
            _ => {}
        }
        let Some(value) =
            self.store.kv_get(SESSION_BUDGETS_NAMESPACE, session_key.as_str(), 0).await?
        else {
            return Ok(None);
        };
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("budget of session {session_key}: {e}")))
    }

    /// Sets (or, with `None`, removes) the session's own limits; flushed
    /// before it returns, so they hold after a restart.
    ///
    /// # Errors
    /// The store cannot be written.
    pub async fn set_session_limits(
        &self,
        session_key: &SessionKey,
        limits: Option<SessionLimits>,
    ) -> Result<(), StoreError> {
        if limits.is_some() {
            // Before the record can be seen, so no check skips it.
            self.stored_limits.store(SOME, Ordering::Release);
        }
        match limits {
            Some(limits) => {
                let value = serde_json::to_value(limits)
                    .map_err(|e| StoreError::Database(e.to_string()))?;
                self.store
                    .kv_put(SESSION_BUDGETS_NAMESPACE, session_key.as_str(), value, None)
                    .await
            }
            None => self.store.kv_delete(SESSION_BUDGETS_NAMESPACE, session_key.as_str()).await,
        }
        self.store.flush().await
    }

    /// What the session spent today and its limits (without a binding's).
    ///
    /// # Errors
    /// The store cannot be read.
    pub async fn report(&self, session_key: &SessionKey) -> Result<SessionBudget, StoreError> {
        session_report(&self.store, &self.config(), session_key, None, (self.now_ms)()).await
    }

    fn binding_of(&self, run_id: &RunId) -> Option<SessionLimits> {
        self.admitted.lock().unwrap_or_else(|e| e.into_inner()).get(run_id).copied()
    }

    /// The limits of a run, with what its session and the day spent where a
    /// limit needs it.
    async fn standing(&self, scope: &BudgetScope<'_>) -> Result<Standing, StoreError> {
        let config = self.config();
        let session_override = self.session_limits(scope.session_key).await?;
        let binding = self.binding_of(scope.run_id);
        let limits = config.limits(&[session_override.as_ref(), binding.as_ref()]);
        let since_ms = utc_day_start((self.now_ms)());
        let session_today = if limits.session.session_daily_tokens.is_some()
            || limits.session.session_daily_usd.is_some()
        {
            let filter = UsageFilter {
                since_ms,
                session_key: Some(scope.session_key.clone()),
                engine: None,
            };
            self.store.usage().usage_totals(&filter).await?.spend
        } else {
            RunSpend::default()
        };
        let all_today = if limits.daily_tokens.is_some() || limits.daily_usd.is_some() {
            let filter = UsageFilter { since_ms, ..UsageFilter::default() };
            self.store.usage().usage_totals(&filter).await?.spend
        } else {
            RunSpend::default()
        };
        Ok(Standing { config, limits, session_today, all_today })
    }
}

/// What [`StoreBudgetGuard::standing`] found.
struct Standing {
    config: Arc<BudgetsConfig>,
    limits: BudgetLimits,
    session_today: RunSpend,
    all_today: RunSpend,
}

impl Standing {
    /// The first limit that `run` (spent by the running run) reaches.
    fn exceeded(&self, run: &RunSpend) -> Option<BudgetExceeded> {
        let session = self.session_today.plus(run);
        let all = self.all_today.plus(run);
        let limits = &self.limits;
        let tokens = [
            ("run_tokens", limits.session.run_tokens, run.tokens()),
            ("session_daily_tokens", limits.session.session_daily_tokens, session.tokens()),
            ("daily_tokens", limits.daily_tokens, all.tokens()),
        ];
        let dollars = [
            ("run_usd", limits.session.run_usd, run.usd),
            ("session_daily_usd", limits.session.session_daily_usd, session.usd),
            ("daily_usd", limits.daily_usd, all.usd),
        ];
        let over_tokens = tokens.into_iter().find_map(|(limit, allowed, spent)| {
            let allowed = allowed.filter(|allowed| spent >= *allowed)?;
            Some(BudgetExceeded {
                limit: limit.to_owned(),
                allowed: format!("{allowed} tokens"),
                spent: format!("{spent} tokens"),
            })
        });
        over_tokens.or_else(|| {
            dollars.into_iter().find_map(|(limit, allowed, spent)| {
                let allowed = allowed.filter(|allowed| spent >= *allowed)?;
                Some(BudgetExceeded {
                    limit: limit.to_owned(),
                    allowed: usd_text(allowed),
                    spent: usd_text(spent),
                })
            })
        })
    }

    /// The dollars left under the tightest dollar limit, for a run that has
    /// spent nothing yet.
    fn remaining_usd(&self) -> Option<f64> {
        let limits = &self.limits;
        [
            limits.session.run_usd,
            limits.session.session_daily_usd.map(|allowed| allowed - self.session_today.usd),
            limits.daily_usd.map(|allowed| allowed - self.all_today.usd),
        ]
        .into_iter()
        .flatten()
        .reduce(f64::min)
        .map(|left| left.max(0.0))
    }
}

/// Dollars as users read them: `$0.0123`.
pub fn usd_text(usd: f64) -> String {
    format!("${usd:.4}")
}

fn price_scope<'a>(scope: &BudgetScope<'a>) -> (&'a str, Option<&'a str>) {
    (scope.engine, Some(scope.model).filter(|m| !m.is_empty()))
}

#[async_trait]
impl BudgetGuard for StoreBudgetGuard {
    async fn check(&self, scope: BudgetScope<'_>, run: TokenUsage) -> Result<(), BudgetExceeded> {
        let standing = match self.standing(&scope).await {
            Ok(standing) => standing,
            Err(error) => {
                // A store that cannot be read stops far more than budgets; the
                // run goes on rather than failing on a limit nobody reached.
                tracing::warn!(run_id = %scope.run_id, %error, "could not read the budget; not enforced");
                return Ok(());
            }
        };
        let (engine, model) = price_scope(&scope);
        let reported = ReportedUsage {
            input_tokens: run.input_tokens,
            output_tokens: run.output_tokens,
            ..ReportedUsage::default()
        };
        let spend = RunSpend::from_reported(&reported, standing.config.price(engine, model));
        match standing.exceeded(&spend) {
            Some(exceeded) => Err(exceeded),
            None => Ok(()),
        }
    }

    async fn admit(
        &self,
        scope: BudgetScope<'_>,
        binding: Option<&SessionLimits>,
    ) -> Result<(), BudgetExceeded> {
        if let Some(binding) = binding {
            let mut admitted = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
            admitted.insert(scope.run_id.clone(), *binding);
        }
        self.check(scope, TokenUsage::default()).await
    }

    fn finish(&self, run_id: &RunId) {
        self.admitted.lock().unwrap_or_else(|e| e.into_inner()).remove(run_id);
    }

    async fn remaining_usd(&self, scope: BudgetScope<'_>) -> Option<f64> {
        match self.standing(&scope).await {
            Ok(standing) => standing.remaining_usd(),
            Err(error) => {
                tracing::warn!(run_id = %scope.run_id, %error, "could not read the budget");
                None
            }
        }
    }

    fn spend(&self, scope: BudgetScope<'_>, usage: &serde_json::Value) -> RunSpend {
        let (engine, model) = price_scope(&scope);
        RunSpend::from_reported(
            &ReportedUsage::from_json(usage),
            self.config().price(engine, model),
        )
    }
}

/// What `session_key` spent today (the UTC day of `now_ms`) and its limits:
/// its own override, then `binding`'s, then `config`'s.
///
/// # Errors
/// The store cannot be read.
pub async fn session_report(
    store: &StoreHandle,
    config: &BudgetsConfig,
    session_key: &SessionKey,
    binding: Option<&SessionLimits>,
    now_ms: i64,
) -> Result<SessionBudget, StoreError> {
    let session_override =
        match store.kv_get(SESSION_BUDGETS_NAMESPACE, session_key.as_str(), 0).await? {
            Some(value) => serde_json::from_value(value).ok(),
            None => None,
        };
    let day_start_ms = utc_day_start(now_ms);
    let limits = config.limits(&[session_override.as_ref(), binding]);
    let session_filter = UsageFilter {
        since_ms: day_start_ms,
        session_key: Some(session_key.clone()),
        engine: None,
    };
    let session_today = store.usage().usage_totals(&session_filter).await?;
    let all_filter = UsageFilter { since_ms: day_start_ms, ..UsageFilter::default() };
    let all_today = store.usage().usage_totals(&all_filter).await?;
    Ok(SessionBudget { limits, session_override, session_today, all_today, day_start_ms })
}

#[cfg(test)]
mod tests;
