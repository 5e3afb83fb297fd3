//! The store's guard: each limit, the overrides, the UTC day and pricing.

use std::collections::BTreeMap;

use super::*;
use crate::config::ModelPrice;
use crate::engine::Completion;
use crate::store::{FinishedRun, NewRun};

/// 2026-12-01 12:00 UTC.
const NOON: i64 = 1_796_126_400_000;

fn limits(f: impl FnOnce(&mut BudgetsConfig)) -> BudgetsConfig {
    let mut config = BudgetsConfig::default();
    f(&mut config);
    config
}

fn guard(store: &StoreHandle, config: BudgetsConfig, now: i64) -> StoreBudgetGuard {
    StoreBudgetGuard::new(store.clone(), config).with_clock(move || now)
}

/// A finished run of `session` that spent `tokens` (input) and `usd`, at `at_ms`.
async fn spent(store: &StoreHandle, id: &str, session: &str, tokens: u64, usd: f64, at_ms: i64) {
    let run_id = RunId::parse(id).unwrap();
    store
        .insert_run(NewRun {
            run_id: run_id.clone(),
            session_key: session.into(),
            conversation: format!("session:{session}"),
            engine: "codex".to_owned(),
            prompt: "p".to_owned(),
            meta: serde_json::json!({}),
            resumed_from: None,
            created_at_ms: at_ms - 10,
        })
        .await;
    store
        .finalize_run(FinishedRun {
            run_id,
            engine: "codex".to_owned(),
            completion: Completion::success("a", None),
            completed_at_ms: at_ms,
            duration_ms: 10,
            spend: RunSpend { input_tokens: tokens, usd, ..RunSpend::default() },
        })
        .await;
}

async fn check(
    guard: &StoreBudgetGuard,
    session: &str,
    run: TokenUsage,
) -> Result<(), BudgetExceeded> {
    let (run_id, session) = (RunId::parse("now").unwrap(), SessionKey::from(session));
    let scope =
        BudgetScope { run_id: &run_id, session_key: &session, engine: "lemon", model: "m1" };
    guard.check(scope, run).await
}

fn used(input_tokens: u64, output_tokens: u64) -> TokenUsage {
    TokenUsage { input_tokens, output_tokens }
}

fn limit_of(result: Result<(), BudgetExceeded>) -> Option<String> {
    result.err().map(|e| e.limit)
}

#[tokio::test]
async fn no_limits_let_everything_through() {
    let store = StoreHandle::memory();
    spent(&store, "r1", "a", 1_000_000, 100.0, NOON - 1).await;
    let guard = guard(&store, BudgetsConfig::default(), NOON);
    assert_eq!(check(&guard, "a", used(u64::MAX / 4, 1)).await, Ok(()));
}

#[tokio::test]
async fn a_run_stops_at_its_token_and_dollar_limits() {
    let store = StoreHandle::memory();
    let mut prices = BTreeMap::new();
    prices.insert(
        "m1".to_owned(),
        ModelPrice {
            input_per_mtok: 1.0,
            output_per_mtok: 10.0,
            cache_read_per_mtok: None,
            cache_write_per_mtok: None,
        },
    );
    let config = limits(|c| {
        c.run_tokens = Some(1000);
        c.prices = prices.clone();
    });
    let tokens_only = guard(&store, config, NOON);
    assert_eq!(check(&tokens_only, "a", used(500, 499)).await, Ok(()));
    let over = check(&tokens_only, "a", used(500, 500)).await.unwrap_err();
    assert_eq!(
        over,
        BudgetExceeded {
            limit: "run_tokens".to_owned(),
            allowed: "1000 tokens".to_owned(),
            spent: "1000 tokens".to_owned()
        }
    );
    assert_eq!(over.detail(), "run_tokens reached: spent 1000 tokens of 1000 tokens");

    // 100k output tokens at $10 per million: $1.
    let dollars = guard(
        &store,
        limits(|c| {
            c.run_usd = Some(1.0);
            c.prices = prices;
        }),
        NOON,
    );
    assert_eq!(check(&dollars, "a", used(0, 99_000)).await, Ok(()));
    let over = check(&dollars, "a", used(0, 100_000)).await.unwrap_err();
    assert_eq!((over.limit.as_str(), over.spent.as_str()), ("run_usd", "$1.0000"));
}

#[tokio::test]
async fn a_session_stops_at_its_daily_limit_while_others_go_on() {
    let store = StoreHandle::memory();
    spent(&store, "r1", "a", 10, 0.30, NOON - 3_600_000).await;
    spent(&store, "r2", "a", 10, 0.25, NOON - 60_000).await;
    spent(&store, "r3", "b", 10, 0.10, NOON - 60_000).await;
    let guard = guard(&store, limits(|c| c.session_daily_usd = Some(0.5)), NOON);
    let over = check(&guard, "a", TokenUsage::default()).await.unwrap_err();
    assert_eq!(
        (over.limit.as_str(), over.allowed.as_str(), over.spent.as_str()),
        ("session_daily_usd", "$0.5000", "$0.5500")
    );
    assert_eq!(check(&guard, "b", TokenUsage::default()).await, Ok(()));

    let tokens = limits(|c| c.session_daily_tokens = Some(25));
    let guard = StoreBudgetGuard::new(store.clone(), tokens).with_clock(|| NOON);
    assert_eq!(check(&guard, "a", used(4, 0)).await, Ok(()), "20 stored + 4 running");
    assert_eq!(
        limit_of(check(&guard, "a", used(5, 0)).await).as_deref(),
        Some("session_daily_tokens")
    );
}

#[tokio::test]
async fn the_day_is_the_utc_day() {
    let store = StoreHandle::memory();
    let midnight = utc_day_start(NOON);
    assert_eq!(midnight, NOON - 12 * 3_600_000);
    spent(&store, "r1", "a", 10, 0.9, midnight - 1).await;
    spent(&store, "r2", "a", 10, 0.2, midnight).await;
    let config = limits(|c| c.session_daily_usd = Some(1.0));
    // Just before midnight both runs are the same day: over.
    let before = guard(&store, config.clone(), midnight - 1);
    assert_eq!(
        limit_of(check(&before, "a", TokenUsage::default()).await).as_deref(),
        Some("session_daily_usd")
    );
    // After it, only the run at midnight counts.
    let after = guard(&store, config, NOON);
    assert_eq!(check(&after, "a", TokenUsage::default()).await, Ok(()));
    let report = after.report(&"a".into()).await.unwrap();
    assert_eq!(report.session_today.runs, 1);
    assert!((report.session_today.spend.usd - 0.2).abs() < 1e-9);
    assert_eq!(report.day_start_ms, midnight);
}

#[tokio::test]
async fn the_daily_limit_counts_every_session() {
    let store = StoreHandle::memory();
    spent(&store, "r1", "a", 600, 0.0, NOON - 1).await;
    spent(&store, "r2", "b", 400, 0.0, NOON - 1).await;
    let guard = guard(&store, limits(|c| c.daily_tokens = Some(1000)), NOON);
    for session in ["a", "b", "c"] {
        let over = check(&guard, session, TokenUsage::default()).await.unwrap_err();
        assert_eq!(over.limit, "daily_tokens", "{session}");
    }
}

#[tokio::test]
async fn a_binding_and_a_session_override_the_global_limits_key_by_key() {
    let store = StoreHandle::memory();
    spent(&store, "r1", "a", 10, 0.4, NOON - 1).await;
    let guard = guard(
        &store,
        limits(|c| {
            c.session_daily_usd = Some(1.0);
            c.run_tokens = Some(100);
        }),
        NOON,
    );
    let (run_id, session) = (RunId::parse("now").unwrap(), SessionKey::from("a"));
    let scope = BudgetScope { run_id: &run_id, session_key: &session, engine: "lemon", model: "" };
    assert_eq!(guard.admit(scope, None).await, Ok(()));

    // The binding's lower dollar limit applies to the run it admitted...
    let binding = SessionLimits { session_daily_usd: Some(0.3), ..SessionLimits::default() };
    let over = guard.admit(scope, Some(&binding)).await.unwrap_err();
    assert_eq!((over.limit.as_str(), over.allowed.as_str()), ("session_daily_usd", "$0.3000"));
    assert_eq!(
        limit_of(guard.check(scope, TokenUsage::default()).await).as_deref(),
        Some("session_daily_usd")
    );
    // ...while the global token limit still holds.
    assert_eq!(limit_of(guard.check(scope, used(100, 0)).await).as_deref(), Some("run_tokens"));
    guard.finish(&run_id);
    assert_eq!(guard.check(scope, TokenUsage::default()).await, Ok(()), "forgotten once finished");

    // The session's own limit wins over the binding's and the global one.
    let own = SessionLimits {
        session_daily_usd: Some(5.0),
        run_tokens: Some(10),
        ..SessionLimits::default()
    };
    guard.set_session_limits(&session, Some(own)).await.unwrap();
    assert_eq!(guard.session_limits(&session).await.unwrap(), Some(own));
    assert_eq!(guard.admit(scope, Some(&binding)).await, Ok(()));
    assert_eq!(limit_of(guard.check(scope, used(10, 0)).await).as_deref(), Some("run_tokens"));
    let report = guard.report(&session).await.unwrap();
    assert_eq!(report.limits.session.session_daily_usd, Some(5.0));
    assert_eq!(report.session_override, Some(own));
    guard.set_session_limits(&session, None).await.unwrap();
    assert_eq!(guard.session_limits(&session).await.unwrap(), None);
}

#[tokio::test]
async fn what_is_left_is_the_tightest_dollar_limit() {
    let store = StoreHandle::memory();
    spent(&store, "r1", "a", 10, 0.75, NOON - 1).await;
    spent(&store, "r2", "b", 10, 1.0, NOON - 1).await;
    let (run_id, session) = (RunId::parse("now").unwrap(), SessionKey::from("a"));
    let scope = BudgetScope { run_id: &run_id, session_key: &session, engine: "claude", model: "" };
    let none = guard(&store, limits(|c| c.run_tokens = Some(5)), NOON);
    assert_eq!(none.remaining_usd(scope).await, None, "no dollar limit");
    let config = limits(|c| {
        c.run_usd = Some(2.0);
        c.session_daily_usd = Some(1.0);
        c.daily_usd = Some(10.0);
    });
    let left = guard(&store, config, NOON).remaining_usd(scope).await.unwrap();
    assert!((left - 0.25).abs() < 1e-9, "{left}");
    let spent_out = guard(&store, limits(|c| c.daily_usd = Some(1.0)), NOON);
    assert_eq!(spent_out.remaining_usd(scope).await, Some(0.0));
}

#[tokio::test]
async fn a_reload_puts_new_limits_and_prices_in_force() {
    let store = StoreHandle::memory();
    let guard = guard(&store, BudgetsConfig::default(), NOON);
    assert_eq!(check(&guard, "a", used(10, 0)).await, Ok(()));
    guard.reconfigure(limits(|c| c.run_tokens = Some(10)));
    assert_eq!(limit_of(check(&guard, "a", used(10, 0)).await).as_deref(), Some("run_tokens"));
    let (run_id, session) = (RunId::parse("now").unwrap(), SessionKey::from("a"));
    let scope = BudgetScope { run_id: &run_id, session_key: &session, engine: "codex", model: "" };
    let usage = serde_json::json!({"input_tokens": 2_000_000, "output_tokens": 0});
    assert_eq!(guard.spend(scope, &usage).usd, 0.0);
    guard.reconfigure(limits(|c| {
        c.prices.insert(
            "codex".to_owned(),
            ModelPrice {
                input_per_mtok: 1.5,
                output_per_mtok: 6.0,
                cache_read_per_mtok: None,
                cache_write_per_mtok: None,
            },
        );
    }));
    assert_eq!(guard.spend(scope, &usage).usd, 3.0, "priced by engine when no model is named");
}

#[tokio::test]
async fn limits_a_session_set_before_a_start_hold_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = StoreHandle::open_sqlite(&dir.path().join("b.db")).unwrap();
    let session = SessionKey::from("a");
    let own = SessionLimits { run_tokens: Some(10), ..SessionLimits::default() };
    let before = guard(&store, BudgetsConfig::default(), NOON);
    assert_eq!(check(&before, "a", used(10, 0)).await, Ok(()), "no limits yet");
    before.set_session_limits(&session, Some(own)).await.unwrap();
    assert_eq!(limit_of(check(&before, "a", used(10, 0)).await).as_deref(), Some("run_tokens"));
    // A new guard over the same store, as after a restart.
    let after = guard(&store, BudgetsConfig::default(), NOON);
    assert_eq!(limit_of(check(&after, "a", used(10, 0)).await).as_deref(), Some("run_tokens"));
    assert_eq!(check(&after, "b", used(10, 0)).await, Ok(()), "other sessions have none");
}
