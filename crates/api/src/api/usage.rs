//! `GET /v1/usage` (what runs spent, in total and per engine and session) and
//! `GET`/`PUT /v1/sessions/{key}/budget` (a session's limits and spend today).

use axum::extract::State;
use axum::Json;
use lemon_core::budget::store_guard::SessionBudget;
use lemon_core::config::{BudgetLimits, SessionLimits};
use lemon_core::ids::SessionKey;
use lemon_core::store::{UsageFilter, UsageGroup, UsageTotals};
use serde::Deserialize;
use serde_json::{json, Value};

use super::ApiState;
use crate::error::{ApiError, JsonBody, PathParams, QueryParams};
use crate::openapi::{schema, Errors};

/// The query of `GET /v1/usage`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct UsageQuery {
    /// Milliseconds since the epoch, or an RFC 3339 time; unset: everything.
    since: Option<String>,
    session: Option<String>,
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

/// A spend and run count as JSON.
pub(super) fn totals_json(totals: &UsageTotals) -> Value {
    let spend = &totals.spend;
    json!({
        "runs": totals.runs,
        "input_tokens": spend.input_tokens,
        "output_tokens": spend.output_tokens,
        "cache_read_tokens": spend.cache_read_tokens,
        "cache_write_tokens": spend.cache_write_tokens,
        "tokens": spend.tokens(),
        "usd": spend.usd,
    })
}

/// `GET /v1/usage?since=&session=&engine=`.
#[utoipa::path(
    get,
    path = "/v1/usage",
    tag = "usage",
    params(UsageQuery),
    responses((status = 200, description = "Totals, per engine and per session.", body = schema::Usage), Errors)
)]
pub(super) async fn usage(
    State(state): State<ApiState>,
    QueryParams(query): QueryParams<UsageQuery>,
) -> Result<Json<Value>, ApiError> {
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
    let groups = |list: Vec<(String, UsageTotals)>, name: &str| -> Vec<Value> {
        list.iter()
            .map(|(key, totals)| {
                let mut entry = totals_json(totals);
                entry[name] = json!(key);
                entry
            })
            .collect()
    };
    let by_engine = groups(usage.usage_by(&filter, UsageGroup::Engine).await?, "engine");
    let by_session = groups(usage.usage_by(&filter, UsageGroup::Session).await?, "session_key");
    Ok(Json(json!({
        "since_ms": since,
        "total": totals_json(&total),
        "engines": by_engine,
        "sessions": by_session,
    })))
}

fn limits_json(limits: &BudgetLimits) -> Value {
    json!({
        "run_tokens": limits.session.run_tokens,
        "run_usd": limits.session.run_usd,
        "session_daily_tokens": limits.session.session_daily_tokens,
        "session_daily_usd": limits.session.session_daily_usd,
        "daily_tokens": limits.daily_tokens,
        "daily_usd": limits.daily_usd,
    })
}

fn budget_json(key: &SessionKey, budget: &SessionBudget) -> Value {
    json!({
        "session_key": key,
        "limits": limits_json(&budget.limits),
        "session_override": budget.session_override,
        "day_start_ms": budget.day_start_ms,
        "today": totals_json(&budget.session_today),
        "all_sessions_today": totals_json(&budget.all_today),
    })
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
    responses((status = 200, description = "The session's limits and spend today.", body = schema::Budget), Errors)
)]
pub(super) async fn get_budget(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
) -> Result<Json<Value>, ApiError> {
    let key = session_key(&key)?;
    let budget = state.budget.report(&key).await?;
    Ok(Json(budget_json(&key, &budget)))
}

/// The body of `PUT /v1/sessions/{key}/budget`: the session's own limits; an
/// absent or `null` key keeps the binding's or the global one.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BudgetBody {
    run_tokens: Option<u64>,
    run_usd: Option<f64>,
    session_daily_tokens: Option<u64>,
    session_daily_usd: Option<f64>,
}

/// `PUT /v1/sessions/{key}/budget`: sets the session's own limits (an empty
/// object removes them); persisted, and in force for the session's next check.
#[utoipa::path(
    put,
    path = "/v1/sessions/{key}/budget",
    tag = "usage",
    params(("key" = String, Path, description = "The session key.")),
    request_body = BudgetBody,
    responses((status = 200, description = "The session's limits and spend today.", body = schema::Budget), Errors)
)]
pub(super) async fn put_budget(
    State(state): State<ApiState>,
    PathParams(key): PathParams<String>,
    JsonBody(body): JsonBody<BudgetBody>,
) -> Result<Json<Value>, ApiError> {
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
    Ok(Json(budget_json(&key, &budget)))
}
