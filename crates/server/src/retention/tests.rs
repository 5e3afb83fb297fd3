//! Retention on a real SQLite file, in paused time: a year of finished runs
//! ages out as configured while what must stay stays.

use std::sync::Arc;

use lemon_core::budget::usage::RunSpend;
use lemon_core::bus::{BusEvent, EventKind};
use lemon_core::config::RetentionConfig;
use lemon_core::engine::{Action, ActionKind, ActionPhase, Completion};
use lemon_core::ids::RunId;
use lemon_core::store::upkeep::Upkeep;
use lemon_core::store::{FinishedRun, NewRun, StoreHandle, UsageFilter, UsageGroup};
use serde_json::json;

use super::{Retention, DAY_MS};

/// The moment the passes run at: fixed, so that no boundary moves between two
/// reads of a clock, and later than the wall clock, which the store's own
/// reads purge expired records by.
const NOW_MS: i64 = 4_000_000_000_000;

fn id(n: usize) -> RunId {
    RunId::parse(&format!("run_{n:05}")).unwrap()
}

fn event(run: &RunId, index: u64, kind: EventKind) -> Arc<BusEvent> {
    Arc::new(BusEvent { run_id: run.clone(), session_key: "s".into(), index, ts_ms: NOW_MS, kind })
}

/// Run `n` finished `age_days` ago with a command, some text and its end.
async fn finished_run(store: &StoreHandle, n: usize, age_ms: i64) {
    let run = id(n);
    let completed_at_ms = NOW_MS - age_ms;
    store
        .insert_run(NewRun {
            run_id: run.clone(),
            session_key: format!("session-{}", n % 3).into(),
            conversation: format!("session:{}", n % 3),
            engine: "echo".to_owned(),
            prompt: format!("prompt {n}"),
            meta: json!({}),
            resumed_from: None,
            created_at_ms: completed_at_ms - 1_000,
        })
        .await;
    store.mark_running(run.clone(), "echo".to_owned(), completed_at_ms - 900).await;
    let action = |phase| Action {
        id: "a1".to_owned(),
        kind: ActionKind::Command,
        title: format!("make test {n}"),
        detail: serde_json::Value::Null,
        phase,
        ok: (phase == ActionPhase::Completed).then_some(n % 2 == 0),
        message: None,
        level: None,
        result_meta: serde_json::Value::Null,
    };
    let completion = Completion::success(format!("answer {n}"), None);
    for (index, kind) in [
        EventKind::EngineAction(action(ActionPhase::Started)),
        EventKind::EngineAction(action(ActionPhase::Completed)),
        EventKind::Delta { seq: 1, text: format!("answer {n}") },
        EventKind::RunCompleted {
            completion: completion.clone(),
            engine: "echo".to_owned(),
            duration_ms: 900,
        },
    ]
    .into_iter()
    .enumerate()
    {
        store.append_event(event(&run, index as u64 + 1, kind)).await;
    }
    store
        .finalize_run(FinishedRun {
            run_id: run,
            engine: "echo".to_owned(),
            completion,
            completed_at_ms,
            duration_ms: 900,
            spend: RunSpend {
                input_tokens: 10,
                output_tokens: n as u64,
                usd: 0.25,
                ..RunSpend::default()
            },
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_year_of_runs_ages_out_as_configured_and_what_must_stay_stays() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lemon.db");
    let store = StoreHandle::open_sqlite_inline(&db).unwrap();
    // Four runs a day for 420 days, the newest at the start of the window.
    let runs = 420 * 4;
    for n in 0..runs {
        finished_run(&store, n, (n as i64) * DAY_MS / 4 + 60_000).await;
    }
    // Never touched: a queued run and a running one as old as the oldest, a
    // finished one owed a delivery, chat state.
    let old = NOW_MS - 400 * DAY_MS;
    for (n, running) in [(90_000, false), (90_001, true)] {
        let new = NewRun {
            run_id: id(n),
            session_key: "waiting".into(),
            conversation: "session:waiting".to_owned(),
            engine: "echo".to_owned(),
            prompt: "still to do".to_owned(),
            meta: json!({}),
            resumed_from: None,
            created_at_ms: old,
        };
        store.insert_run(new).await;
        if running {
            store.mark_running(id(n), "echo".to_owned(), old).await;
        }
    }
    let owed = id(runs - 1);
    store.kv_put("telegram.delivery", owed.as_str(), json!({ "chat": 7 }), None).await;
    store.put_chat_state(&"session-1".into(), "claude", "tok", NOW_MS).await;
    // Records: one expired idempotency key and one live; an old native session and a fresh one.
    store.kv_put("webhook.idempotency", "old", json!("done"), Some(NOW_MS - 1)).await;
    store.kv_put("webhook.idempotency", "live", json!("done"), Some(NOW_MS + DAY_MS)).await;
    let native = lemon_engines::native::session::NAMESPACE;
    let session = |days: i64| json!({ "version": 1, "updated_at_ms": NOW_MS - days * DAY_MS, "messages": [] });
    store.kv_put(native, "stale", session(91), None).await;
    store.kv_put(native, "fresh", session(89), None).await;
    store.flush().await.unwrap();

    let all = UsageFilter::default();
    let recent = UsageFilter { since_ms: NOW_MS - 400 * DAY_MS, ..UsageFilter::default() };
    let usage_before = store.usage().usage_totals(&recent).await.unwrap();
    let by_session_before = store.usage().usage_by(&recent, UsageGroup::Session).await.unwrap();
    let used_before = store.retention().used_bytes().await.unwrap();

    let upkeep = Upkeep::default();
    let retention = Retention {
        store: store.clone(),
        database: Some(db.clone()),
        upkeep: upkeep.clone(),
        media: None,
    };
    let pass = retention.pass(&RetentionConfig::default(), NOW_MS).await;
    assert_eq!(pass.error, None);

    // Runs older than 30 days are gone, but for the one owed a delivery.
    let kept: Vec<RunId> = (0..runs).filter(|n| *n < 30 * 4).map(id).collect();
    for n in 0..runs {
        let found = store.get_run(id(n).as_str()).await.unwrap();
        let should = n < 30 * 4 || id(n) == owed;
        assert_eq!(found.is_some(), should, "run {n}");
    }
    assert_eq!(pass.removed.get("runs"), Some(&((runs - 30 * 4 - 1) as u64)));
    for n in [90_000, 90_001] {
        let run = store.get_run(id(n).as_str()).await.unwrap().unwrap();
        assert!(!run.status.is_terminal(), "run {n} is {:?}", run.status);
    }
    // Events: whole for the last 7 days; older runs keep their end, marked, and
    // their record keeps the action.
    for run in &kept {
        let record = store.get_run(run.as_str()).await.unwrap().unwrap();
        let events = store.run_events(run.as_str()).await.unwrap();
        let age = NOW_MS - record.completed_at_ms.unwrap();
        if age < 7 * DAY_MS {
            assert_eq!(events.len(), 4, "{run}");
            assert_eq!(record.compacted, None);
        } else {
            assert_eq!(events.len(), 1, "{run}");
            assert_eq!(events[0].kind, "run_completed");
            assert_eq!(events[0].index, 4);
            assert_eq!(events[0].data["compacted"]["events"], 4);
            let compacted = record.compacted.expect("compacted");
            assert_eq!(compacted.events, 4);
            assert_eq!(compacted.actions.len(), 1);
            assert_eq!(compacted.actions[0]["kind"], "command");
            assert_eq!(record.answer.as_deref().map(|a| a.starts_with("answer")), Some(true));
        }
    }
    // What runs spent in the last 400 days reads the same, in total and by
    // session (dollars in binary fractions: a sum split in two may differ in
    // its last bit otherwise).
    assert_eq!(store.usage().usage_totals(&recent).await.unwrap(), usage_before);
    assert_eq!(
        store.usage().usage_by(&recent, UsageGroup::Session).await.unwrap(),
        by_session_before
    );
    // Past 400 days it is gone: what is left is the last 400 days' runs and
    // the old run still owed a delivery.
    let total = store.usage().usage_totals(&all).await.unwrap();
    assert_eq!(total.runs, usage_before.runs + 1);
    assert!(pass.removed.get("usage").is_some_and(|n| *n > 0));
    // Records: the expired key and the stale session go, the rest stays.
    assert_eq!(store.kv_get("webhook.idempotency", "old", 0).await.unwrap(), None);
    assert!(store.kv_get("webhook.idempotency", "live", NOW_MS).await.unwrap().is_some());
    assert_eq!(store.kv_get(native, "stale", NOW_MS).await.unwrap(), None);
    assert!(store.kv_get(native, "fresh", NOW_MS).await.unwrap().is_some());
    assert!(store.kv_get("telegram.delivery", owed.as_str(), NOW_MS).await.unwrap().is_some());
    assert!(store.get_chat_state(&"session-1".into(), NOW_MS).await.unwrap().is_some());
    // The freed pages went back to the file system.
    let used_after = store.retention().used_bytes().await.unwrap();
    assert!(used_after < used_before / 2, "{used_before} → {used_after} bytes in use");
    assert!(pass.removed.get("pages").is_some_and(|n| *n > 0));
    // What status and metrics show.
    let seen = upkeep.snapshot();
    assert_eq!(seen.last_prune.as_ref(), Some(&pass));
    assert_eq!(seen.pruned_total.get("runs"), pass.removed.get("runs"));

    // A second pass finds nothing more.
    let again = retention.pass(&RetentionConfig::default(), NOW_MS).await;
    assert_eq!(again.removed, Default::default(), "{again:?}");
}

#[tokio::test(start_paused = true)]
async fn max_db_mb_removes_the_oldest_finished_runs_until_the_file_is_under_nine_tenths() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lemon.db");
    let store = StoreHandle::open_sqlite_inline(&db).unwrap();
    for n in 0..2_000 {
        finished_run(&store, n, (n as i64) * 60_000).await;
    }
    store.flush().await.unwrap();
    let used = store.retention().used_bytes().await.unwrap();
    let bound_mb = used / 2 / 1_000_000 + 1;
    let config = RetentionConfig { max_db_mb: Some(bound_mb), ..RetentionConfig::default() };
    let retention = Retention {
        store: store.clone(),
        database: Some(db),
        upkeep: Upkeep::default(),
        media: None,
    };
    retention.check_size(&config).await.unwrap();
    let after = store.retention().used_bytes().await.unwrap();
    assert!(after <= bound_mb * 1_000_000 / 100 * 90, "{after} bytes in use, bound {bound_mb} MB");
    // The newest runs stayed, the oldest went.
    assert!(store.get_run(id(0).as_str()).await.unwrap().is_some());
    assert_eq!(store.get_run(id(1_999).as_str()).await.unwrap(), None);
}

#[test]
fn zero_days_keep_forever() {
    assert_eq!(super::days_before(NOW_MS, 0), None);
    assert_eq!(super::days_before(NOW_MS, 2), Some(NOW_MS - 2 * DAY_MS));
}

/// A short soak: rounds of runs with long answers keep coming while the size
/// check runs between them, and the file on disk stops growing at the bound.
#[tokio::test]
async fn under_sustained_runs_the_file_stops_growing_at_max_db_mb() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lemon.db");
    let store = StoreHandle::open_sqlite(&db).unwrap();
    let config = RetentionConfig { max_db_mb: Some(2), ..RetentionConfig::default() };
    let retention = Retention {
        store: store.clone(),
        database: Some(db.clone()),
        upkeep: Upkeep::default(),
        media: None,
    };
    let mut sizes = Vec::new();
    for round in 0..12 {
        for n in 0..400 {
            // Finished just now: only the size bound removes them.
            finished_run(&store, round * 1_000 + n, NOW_MS - lemon_core::clock::now_ms()).await;
        }
        store.flush().await.unwrap();
        retention.check_size(&config).await.unwrap();
        // What the file holds once the log is copied back.
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
        sizes.push(std::fs::metadata(&db).unwrap().len());
    }
    let bound = 2_000_000 + 64 * 1024;
    assert!(sizes.iter().all(|size| *size <= bound), "file sizes {sizes:?}, bound {bound}");
    assert!(sizes[0] < sizes[3], "the first rounds grow the file: {sizes:?}");
    assert!(store.get_run(id(11_399).as_str()).await.unwrap().is_some(), "the newest run stays");
    assert_eq!(store.get_run(id(0).as_str()).await.unwrap(), None, "the oldest went");
    store.close().await.unwrap();
}
