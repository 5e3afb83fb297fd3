//! `GET /v1/usage` (what runs spent, in total and per engine and session) and
//! `GET`/`PUT /v1/sessions/{key}/budget` (a session's limits and spend today).

use axum::extract::State;
use axum::Json;
use lemon_core::budget::store_guard::SessionBudget;
use lemon_core::config::{BudgetLimits, SessionLimits};
use lemon_core::ids::SessionKey;
use lemon_core::store::{UsageFilter, UsageGroup, UsageTotals};
use serde::{Deserialize, Serialize};

use super::ApiState;
use crate::error::{ApiError, JsonBody, PathParams, QueryParams};
use crate::openapi::Errors;

/// `GET /v1/usage`: what finished runs spent since `since_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Usage {
    /// Per engine.
    pub(crate) engines: Vec<EngineTotals>,
    /// Per session.
    pub(crate) sessions: Vec<SessionTotals>,
    /// The start of the span (ms since the epoch; 0: everything).
    pub(crate) since_ms: i64,
    pub(crate) total: Totals,
}

/// Tokens, dollars and runs over a span.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Totals {
    /// Prompt tokens read from the engine's cache.
    pub(crate) cache_read_tokens: u64,
    /// Prompt tokens written to the engine's cache.
    pub(crate) cache_write_tokens: u64,
    /// Prompt tokens, cache traffic left out.
    pub(crate) input_tokens: u64,
    /// Tokens of the answer.
    pub(crate) output_tokens: u64,
    /// Finished runs.
    pub(crate) runs: u64,
    /// What token limits count: input plus output.
    pub(crate) tokens: u64,
    /// US dollars.
    pub(crate) usd: f64,
}

impl From<&UsageTotals> for Totals {
    fn from(totals: &UsageTotals) -> Self {
        let spend = &totals.spend;
        Totals {
            cache_read_tokens: spend.cache_read_tokens,
            cache_write_tokens: spend.cache_write_tokens,
            input_tokens: spend.input_tokens,
            output_tokens: spend.output_tokens,
            runs: totals.runs,
            tokens: spend.tokens(),
            usd: spend.usd,
        }
    }
}

/// Tokens, dollars and runs of one engine.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct EngineTotals {
    /// Prompt tokens read from the engine's cache.
    pub(crate) cache_read_tokens: u64,
    /// Prompt tokens written to the engine's cache.
    pub(crate) cache_write_tokens: u64,
    /// The engine (`claude`).
    pub(crate) engine: String,
    /// Prompt tokens, cache traffic left out.
    pub(crate) input_tokens: u64,
    /// Tokens of the answers.
    pub(crate) output_tokens: u64,
    /// Finished runs.
    pub(crate) runs: u64,
    /// What token limits count: input plus output.
    pub(crate) tokens: u64,
    /// US dollars.
    pub(crate) usd: f64,
}

impl EngineTotals {
    fn new(engine: String, totals: &UsageTotals) -> Self {
        let Totals {
            cache_read_tokens,
            cache_write_tokens,
            input_tokens,
            output_tokens,
            runs,
            tokens,
            usd,
        } = Totals::from(totals);
        EngineTotals {
            cache_read_tokens,
            cache_write_tokens,
            engine,
            input_tokens,
            output_tokens,
            runs,
            tokens,
            usd,
        }
    }
}

/// Tokens, dollars and runs of one session.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct SessionTotals {
    /// Prompt tokens read from the engine's cache.
    pub(crate) cache_read_tokens: u64,
    /// Prompt tokens written to the engine's cache.
    pub(crate) cache_write_tokens: u64,
    /// Prompt tokens, cache traffic left out.
    pub(crate) input_tokens: u64,
    /// Tokens of the answer.
    pub(crate) output_tokens: u64,
    /// Finished runs.
    pub(crate) runs: u64,
    pub(crate) session_key: String,
    /// What token limits count: input plus output.
    pub(crate) tokens: u64,
    /// US dollars.
    pub(crate) usd: f64,
}

impl SessionTotals {
    fn new(session_key: String, totals: &UsageTotals) -> Self {
        let Totals {
            cache_read_tokens,
            cache_write_tokens,
            input_tokens,
            output_tokens,
            runs,
            tokens,
            usd,
        } = Totals::from(totals);
        SessionTotals {
            cache_read_tokens,
            cache_write_tokens,
            input_tokens,
            output_tokens,
            runs,
            session_key,
            tokens,
            usd,
        }
    }
}

/// `GET` and `PUT /v1/sessions/{key}/budget`: the limits in force for a
/// session and what it spent today (UTC).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Budget {
    /// What every session spent today.
    pub(crate) all_sessions_today: Totals,
    /// The start of the current UTC day (ms since the epoch).
    pub(crate) day_start_ms: i64,
    /// The limits in force: the session's own, its binding's, then the global ones.
    pub(crate) limits: Limits,
    pub(crate) session_key: String,
    /// The session's own limits (`PUT`), if it has some.
    #[schema(required = true)]
    pub(crate) session_override: Option<SessionLimitsBody>,
    /// What this session spent today.
    pub(crate) today: Totals,
}

/// The limits in force for a session (`null`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, utoipa::ToSchema)]
pub(crate) struct Limits {
    /// Tokens all sessions may spend per UTC day.
    #[schema(required = true)]
    pub(crate) daily_tokens: Option<u64>,
    /// US dollars all sessions may spend per UTC day.
    #[schema(required = true)]
    pub(crate) daily_usd: Option<f64>,
    /// Tokens one run may spend.
    #[schema(required = true)]
    pub(crate) run_tokens: Option<u64>,
    /// US dollars one run may spend.
    #[schema(required = true)]
    pub(crate) run_usd: Option<f64>,
    /// Tokens the session may spend per UTC day.
    #[schema(required = true)]
    pub(crate) session_daily_tokens: Option<u64>,
    /// US dollars the session may spend per UTC day.
    #[schema(required = true)]
    pub(crate) session_daily_usd: Option<f64>,
}

impl From<&BudgetLimits> for Limits {
    fn from(limits: &BudgetLimits) -> Self {
        Limits {
            daily_tokens: limits.daily_tokens,
            daily_usd: limits.daily_usd,
            run_tokens: limits.session.run_tokens,
            run_usd: limits.session.run_usd,
            session_daily_tokens: limits.session.session_daily_tokens,
            session_daily_usd: limits.session.session_daily_usd,
        }
    }
}

/// The query of `GET /v1/usage`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct UsageQuery {
    /// Milliseconds since the epoch, or an RFC 3339 time; unset: everything.
    since: Option<String>,
    /// Only this session's runs.
    session: Option<String>,
    /// Only this engine's runs (`claude`).
    engine: Option<String>,
}

/// `since` as milliseconds since the epoch.
fn since_ms(raw: &str) -> Result<i64, ApiError> {
    let raw = raw.trim();
    if let Ok(ms) = raw.parse::<i64>() {
        return if ms >= 0 {
            Ok(ms)
        } else {
            Err(ApiError::BadRequest("since must not be negative".to_owned()))
        };
    }
    rfc3339_ms(raw).filter(|ms| *ms >= 0).ok_or_else(|| {
        ApiError::BadRequest(format!(
            "since must be milliseconds since the epoch or an RFC 3339 time, not {raw:?}"
        ))
    })
}

/// `2026-12-01T09:30:00Z`, `2026-12-01T09:30:00.250+01:00`: milliseconds
/// since the epoch; anything else is `None`.
fn rfc3339_ms(raw: &str) -> Option<i64> {
    let number = |text: &str| -> Option<i64> {
        (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse().ok())?
    };
    let (date, time) = raw.split_once(['T', 't', ' '])?;
    let mut parts = date.splitn(3, '-');
    let (year, month, day) = (parts.next()?, parts.next()?, parts.next()?);
    if year.len() != 4 || month.len() != 2 || day.len() != 2 {
        return None;
    }
    let (year, month, day) = (number(year)?, number(month)?, number(day)?);
    let (clock, offset_min) = match time.strip_suffix(['Z', 'z']) {
        Some(clock) => (clock, 0),
        None => {
            let at = time.rfind(['+', '-'])?;
            let (clock, offset) = time.split_at(at);
            let (hours, minutes) = offset[1..].split_once(':')?;
            let minutes = number(hours)? * 60 + number(minutes)?;
            (clock, if offset.starts_with('-') { -minutes } else { minutes })
        }
    };
    let (clock, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut hms = clock.splitn(3, ':');
    let (hour, minute, second) = (number(hms.next()?)?, number(hms.next()?)?, number(hms.next()?)?);
    let millis = if fraction.is_empty() {
        0
    } else {
        let digits: String = fraction.chars().chain("000".chars()).take(3).collect();
        number(fraction)?;
        number(&digits)?
    };
    let days_in_month = match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        1..=12 => 31,
        _ => return None,
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_min * 60;
    Some(seconds * 1000 + millis)
}

/// `GET /v1/usage`: what finished runs spent, in total, per engine and per
/// session, since `since`.
#[utoipa::path(
    get,
    path = "/v1/usage",
    tag = "usage",
    params(UsageQuery),
    responses((status = 200, description = "Totals, per engine and per session.", body = Usage), Errors)
)]
pub(super) async fn usage(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<UsageQuery>,
) -> Result<Json<Usage>, ApiError> {
    let since = query.since.as_deref().map(since_ms).transpose()?.unwrap_or(0);
    let session_key = query
        .session
        .as_deref()
        .map(|raw| SessionKey::parse(raw).map_err(|e| ApiError::BadRequest(e.to_string())))
        .transpose()?;
    let engine = query.engine.filter(|e| !e.is_empty());
    if let Some(engine) = &engine {
        lemon_core::ids::EngineId::parse(engine)
            .map_err(|e| ApiError::BadRequest(format!("engine: {e}")))?;
    }
    let filter = UsageFilter { since_ms: since, session_key, engine };
    let usage = state.budget.store().usage();
    let total = usage.usage_totals(&filter).await?;
    let engines = usage.usage_by(&filter, UsageGroup::Engine).await?;
    let sessions = usage.usage_by(&filter, UsageGroup::Session).await?;
    Ok(Json(Usage {
        engines: engines.into_iter().map(|(key, t)| EngineTotals::new(key, &t)).collect(),
        sessions: sessions.into_iter().map(|(key, t)| SessionTotals::new(key, &t)).collect(),
        since_ms: since,
        total: Totals::from(&total),
    }))
}

fn budget_of(key: &SessionKey, budget: &SessionBudget) -> Budget {
    Budget {
        all_sessions_today: Totals::from(&budget.all_today),
        day_start_ms: budget.day_start_ms,
        limits: Limits::from(&budget.limits),
        session_key: key.as_str().to_owned(),
        session_override: budget.session_override.as_ref().map(SessionLimitsBody::from),
        today: Totals::from(&budget.session_today),
    }
}

fn session_key(raw: &str) -> Result<SessionKey, ApiError> {
    SessionKey::parse(raw).map_err(|err| ApiError::BadRequest(err.to_string()))
}

/// `GET /v1/sessions/{key}/budget`: the limits in force, the session's own
/// override and what it spent today (UTC).
#[utoipa::path(
    get,
    path = "/v1/sessions/{key}/budget",
    tag = "usage",
    params(("key" = String, Path, description = "The session key.")),
    responses((status = 200, description = "The session's limits and spend today.", body = Budget), Errors)
)]
pub(super) async fn get_budget(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
) -> Result<Json<Budget>, ApiError> {
    let key = session_key(&key)?;
    let budget = state.budget.report(&key).await?;
    Ok(Json(budget_of(&key, &budget)))
}

/// A session's own limits: the body of `PUT /v1/sessions/{key}/budget`,
/// and `session_override` of the budget. An absent or `null` key keeps the
/// binding's or the global one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionLimitsBody {
    /// Tokens one run may spend.
    pub(crate) run_tokens: Option<u64>,
    /// US dollars one run may spend.
    pub(crate) run_usd: Option<f64>,
    /// Tokens the session may spend per UTC day.
    pub(crate) session_daily_tokens: Option<u64>,
    /// US dollars the session may spend per UTC day.
    pub(crate) session_daily_usd: Option<f64>,
}

impl From<&SessionLimits> for SessionLimitsBody {
    fn from(limits: &SessionLimits) -> Self {
        SessionLimitsBody {
            run_tokens: limits.run_tokens,
            run_usd: limits.run_usd,
            session_daily_tokens: limits.session_daily_tokens,
            session_daily_usd: limits.session_daily_usd,
        }
    }
}

/// `PUT /v1/sessions/{key}/budget`: sets the session's own limits (an empty
/// object removes them); persisted, and in force for the session's next check.
#[utoipa::path(
    put,
    path = "/v1/sessions/{key}/budget",
    tag = "usage",
    params(("key" = String, Path, description = "The session key.")),
    request_body = SessionLimitsBody,
    responses((status = 200, description = "The session's limits and spend today.", body = Budget), Errors)
)]
pub(super) async fn put_budget(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
    JsonBody(body): JsonBody<SessionLimitsBody>,
) -> Result<Json<Budget>, ApiError> {
    let key = session_key(&key)?;
    let limits = SessionLimits {
        run_tokens: body.run_tokens,
        run_usd: body.run_usd,
        session_daily_tokens: body.session_daily_tokens,
        session_daily_usd: body.session_daily_usd,
    };
    if let Some(name) = limits.invalid_key() {
        return Err(ApiError::BadRequest(format!("{name} must be a number of at least 0")));
    }
    let limits = (limits != SessionLimits::default()).then_some(limits);
    state.budget.set_session_limits(&key, limits).await?;
    let budget = state.budget.report(&key).await?;
    Ok(Json(budget_of(&key, &budget)))
}
