//! Store tests: one conformance suite run against every backend, then what only the
//! SQLite backend promises (durability across reopen, migrations, close, errors),
//! then the same for PostgreSQL. The PostgreSQL halves run when
//! `LEMON_TEST_POSTGRES_URL` names a server (see [`postgres::testing`]), each on
//! a database of its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use tempfile::TempDir;

use super::sqlite::{SqliteStore, SCHEMA_VERSION};
use super::*;
use crate::budget::usage::RunSpend;
use crate::bus::{EventKind, RunPhase};
use crate::engine::{Action, ActionKind, ActionPhase, RunError};

/// A backend under test; `dir` keeps the SQLite file's directory alive.
struct Backend {
    name: &'static str,
    store: StoreHandle,
    _dir: Option<TempDir>,
}

/// Every backend, each empty: PostgreSQL on a fresh database when a server is configured.
async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = StoreHandle::open_sqlite(&dir.path().join("lemon.db")).unwrap();
    let inline_dir = tempfile::tempdir().unwrap();
    let inline = StoreHandle::open_sqlite_inline(&inline_dir.path().join("lemon.db")).unwrap();
    let mut backends = vec![
        Backend { name: "memory", store: StoreHandle::memory(), _dir: None },
        Backend { name: "sqlite", store: sqlite, _dir: Some(dir) },
        Backend { name: "sqlite-inline", store: inline, _dir: Some(inline_dir) },
    ];
    if let Some(server) = postgres::testing::server_url() {
        let url = postgres::testing::fresh_database(&server).await;
        backends.push(Backend { name: "postgres", store: open_postgres(&url).await, _dir: None });
    }
    backends
}

fn db_path(dir: &TempDir) -> PathBuf {
    dir.path().join("state").join("lemon.db")
}

fn open(path: &Path) -> StoreHandle {
    StoreHandle::new(Arc::new(SqliteStore::open(path, DEFAULT_CHAT_STATE_TTL_MS).unwrap()))
}

fn open_inline(path: &Path) -> StoreHandle {
    StoreHandle::new(Arc::new(SqliteStore::open_inline(path, DEFAULT_CHAT_STATE_TTL_MS).unwrap()))
}

fn run_id(raw: &str) -> RunId {
    RunId::parse(raw).unwrap()
}

fn new_run(id: &str, created_at_ms: i64) -> NewRun {
    NewRun {
        run_id: run_id(id),
        session_key: format!("session-{id}").into(),
        conversation: format!("session:session-{id}"),
        engine: "echo".to_owned(),
        prompt: format!("prompt of {id}"),
        meta: json!({ "source": "test", "tags": ["a", "b"], "n": 1 }),
        resumed_from: None,
        created_at_ms,
    }
}

/// The record `new_run(id, created_at_ms)` is stored as before anything else happens.
fn queued_record(id: &str, created_at_ms: i64) -> RunRecord {
    let run = new_run(id, created_at_ms);
    RunRecord {
        run_id: id.to_owned(),
        session_key: run.session_key,
        conversation: run.conversation,
        engine: run.engine,
        prompt: run.prompt,
        meta: run.meta,
        status: RunStatus::Queued,
        answer: None,
        error: None,
        error_code: None,
        resumed_from: None,
        resume: None,
        usage: serde_json::Value::Null,
        spend: Default::default(),
        created_at_ms,
        started_at_ms: None,
        completed_at_ms: None,
        duration_ms: None,
        compacted: None,
    }
}

fn event(id: &str, index: u64, kind: EventKind) -> Arc<BusEvent> {
    Arc::new(BusEvent {
        run_id: run_id(id),
        session_key: format!("session-{id}").into(),
        index,
        ts_ms: 5_000 + index as i64,
        kind,
    })
}

/// One event of every kind, in the order a run publishes them.
fn every_kind_of_event(id: &str) -> Vec<Arc<BusEvent>> {
    let completion = Completion {
        ok: true,
        answer: String::new(),
        error: None,
        resume: Some(ResumeToken::new("echo", "tok-1")),
        usage: json!({ "output_tokens": 2 }),
        artifacts: Vec::new(),
        retried_by: None,
    };
    let kinds = vec![
        EventKind::Phase(RunPhase::Dispatched),
        EventKind::RunStarted { engine: "echo".to_owned(), model: Some("small".to_owned()) },
        EventKind::EngineStarted {
            resume: Some(ResumeToken::new("echo", "tok-1")),
            title: Some("Echo".to_owned()),
            meta: json!({ "pid": 7 }),
        },
        EventKind::EngineAction(Action {
            id: "a1".to_owned(),
            kind: ActionKind::Command,
            title: "ls".to_owned(),
            detail: json!({ "exit_code": 0 }),
            phase: ActionPhase::Completed,
            ok: Some(true),
            message: None,
            level: None,
            result_meta: serde_json::Value::Null,
        }),
        EventKind::Delta { seq: 1, text: "hello ".to_owned() },
        EventKind::Delta { seq: 2, text: "wörld \u{1f34b} \"quoted\"\n".to_owned() },
        EventKind::Status(RunStatus::Cancelling),
        EventKind::EngineCompleted(completion.clone()),
        EventKind::RunCompleted { completion, engine: "echo".to_owned(), duration_ms: 42 },
    ];
    kinds.into_iter().zip(1..).map(|(kind, index)| event(id, index, kind)).collect()
}

fn stored(events: &[Arc<BusEvent>]) -> Vec<StoredEvent> {
    events
        .iter()
        .map(|e| StoredEvent {
            index: e.index,
            kind: e.kind.type_name().to_owned(),
            data: e.to_json(),
        })
        .collect()
}

fn finished(id: &str, completion: Completion) -> FinishedRun {
    FinishedRun {
        run_id: run_id(id),
        engine: "echo:fast".to_owned(),
        completion,
        completed_at_ms: 2_000,
        duration_ms: 990,
        spend: Default::default(),
    }
}

/// Inserts, starts and finishes run `id` with `completion`; returns the stored record.
async fn run_to_end(store: &StoreHandle, id: &str, completion: Completion) -> RunRecord {
    store.insert_run(new_run(id, 1_000)).await;
    store.mark_running(run_id(id), "echo".to_owned(), 1_010).await;
    store.finalize_run(finished(id, completion)).await;
    store.get_run(id).await.unwrap().unwrap()
}

#[tokio::test]
async fn run_lifecycle_is_stored_field_by_field() {
    for Backend { name, store, _dir } in backends().await {
        store.insert_run(new_run("run_ok", 1_000)).await;
        assert_eq!(
            store.get_run("run_ok").await.unwrap(),
            Some(queued_record("run_ok", 1_000)),
            "{name}"
        );

        store.mark_running(run_id("run_ok"), "echo:fast".to_owned(), 1_010).await;
        let running = store.get_run("run_ok").await.unwrap().unwrap();
        let expected_running = RunRecord {
            status: RunStatus::Running,
            engine: "echo:fast".to_owned(),
            started_at_ms: Some(1_010),
            ..queued_record("run_ok", 1_000)
        };
        assert_eq!(running, expected_running, "{name}");

        let events = every_kind_of_event("run_ok");
        for event in &events {
            store.append_event(event.clone()).await;
        }
        assert_eq!(store.run_events("run_ok").await.unwrap(), stored(&events), "{name}");

        let completion = Completion {
            ok: true,
            answer: "hello wörld".to_owned(),
            error: None,
            resume: Some(ResumeToken::new("echo", "tok-1")),
            usage: json!({ "input_tokens": 3, "output_tokens": 2, "cost": 0.5 }),
            artifacts: Vec::new(),
            retried_by: None,
        };
        store.finalize_run(finished("run_ok", completion)).await;
        let expected_done = RunRecord {
            status: RunStatus::Completed,
            answer: Some("hello wörld".to_owned()),
            resume: Some(ResumeToken::new("echo", "tok-1")),
            usage: json!({ "input_tokens": 3, "output_tokens": 2, "cost": 0.5 }),
            completed_at_ms: Some(2_000),
            duration_ms: Some(990),
            ..expected_running
        };
        assert_eq!(store.get_run("run_ok").await.unwrap(), Some(expected_done), "{name}");
    }
}

#[tokio::test]
async fn stage_stamps_merge_into_the_run_and_the_first_of_each_stage_stays() {
    use crate::timing::{Stage, Stamps};
    let stamps = |pairs: &[(Stage, i64)]| {
        let mut stamps = Stamps::default();
        for &(stage, at) in pairs {
            stamps.stamp(stage, at);
        }
        stamps
    };
    for Backend { name, store, _dir } in backends().await {
        // In the same batch as the run's insert, and in a later one.
        store.insert_run(new_run("run_st", 1_000)).await;
        store
            .runs()
            .merge_stages(
                run_id("run_st"),
                stamps(&[(Stage::Received, 100), (Stage::Journaled, 250)]),
            )
            .await;
        store.flush().await.unwrap();
        store
            .runs()
            .merge_stages(
                run_id("run_st"),
                stamps(&[(Stage::Journaled, 999), (Stage::Delivered, 4_000_000_000_123)]),
            )
            .await;
        let kept = store.runs().run_stages("run_st").await.unwrap();
        let expected = stamps(&[
            (Stage::Received, 100),
            (Stage::Journaled, 250),
            (Stage::Delivered, 4_000_000_000_123),
        ]);
        assert_eq!(kept, expected, "{name}");
        // A run never written keeps nothing, and an unknown run reads empty.
        store.runs().merge_stages(run_id("run_gone"), stamps(&[(Stage::Received, 1)])).await;
        assert!(store.runs().run_stages("run_gone").await.unwrap().is_empty(), "{name}");
        assert_eq!(store.get_run("run_gone").await.unwrap(), None, "{name}");
    }
}

#[tokio::test]
async fn failed_run_keeps_the_engine_error_text_and_code() {
    for Backend { name, store, _dir } in backends().await {
        let error = RunError::Engine { message: "model overloaded (529)".to_owned() };
        let run = run_to_end(&store, "run_failed", Completion::failure(error, None)).await;
        assert_eq!(run.status, RunStatus::Failed, "{name}");
        assert_eq!(run.answer.as_deref(), Some(""), "{name}");
        assert_eq!(run.error.as_deref(), Some("model overloaded (529)"), "{name}");
        assert_eq!(run.error_code.as_deref(), Some("engine_error"), "{name}");
        assert_eq!(run.resume, None, "{name}");
        assert_eq!(run.usage, serde_json::Value::Null, "{name}");
        assert_eq!((run.completed_at_ms, run.duration_ms), (Some(2_000), Some(990)), "{name}");
    }
}

#[tokio::test]
async fn cancelled_run_is_cancelled_not_failed() {
    for Backend { name, store, _dir } in backends().await {
        let resume = Some(ResumeToken::new("claude", "sess-9"));
        let run = run_to_end(
            &store,
            "run_cancelled",
            Completion::failure(RunError::UserRequested, resume.clone()),
        )
        .await;
        assert_eq!(run.status, RunStatus::Cancelled, "{name}");
        assert_eq!(run.error.as_deref(), Some("user_requested"), "{name}");
        assert_eq!(run.error_code.as_deref(), Some("user_requested"), "{name}");
        assert_eq!(run.resume, resume, "{name}");

        let unavailable = RunError::EngineUnavailable {
            engine: "codex".to_owned(),
            reason: "not installed".to_owned(),
        };
        let run =
            run_to_end(&store, "run_unavailable", Completion::failure(unavailable, None)).await;
        assert_eq!(run.status, RunStatus::Failed, "{name}");
        assert_eq!(
            run.error.as_deref(),
            Some("engine_unavailable: codex (not installed)"),
            "{name}"
        );
        assert_eq!(run.error_code.as_deref(), Some("engine_unavailable"), "{name}");
    }
}

#[tokio::test]
async fn mark_running_after_finalize_keeps_the_terminal_status() {
    for Backend { name, store, _dir } in backends().await {
        run_to_end(&store, "run_late", Completion::failure(RunError::Interrupted, None)).await;
        store.mark_running(run_id("run_late"), "echo".to_owned(), 3_000).await;
        let run = store.get_run("run_late").await.unwrap().unwrap();
        assert_eq!(run.status, RunStatus::Cancelled, "{name}");
        assert_eq!(run.started_at_ms, Some(3_000), "{name}");
    }
}

#[tokio::test]
async fn unknown_runs_are_absent() {
    for Backend { name, store, _dir } in backends().await {
        store.mark_running(run_id("run_nobody"), "echo".to_owned(), 1).await;
        store.finalize_run(finished("run_nobody", Completion::success("x", None))).await;
        assert_eq!(store.get_run("run_nobody").await.unwrap(), None, "{name}");
        assert_eq!(store.run_events("run_nobody").await.unwrap(), vec![], "{name}");
        assert_eq!(
            store.list_runs(RunFilter { status: None, limit: 10 }).await.unwrap(),
            vec![],
            "{name}"
        );
    }
}

#[tokio::test]
async fn events_are_kept_per_run_in_index_order() {
    for Backend { name, store, _dir } in backends().await {
        let a = every_kind_of_event("run_a");
        let b = every_kind_of_event("run_b");
        for (event_a, event_b) in a.iter().zip(&b) {
            store.append_event(event_a.clone()).await;
            store.append_event(event_b.clone()).await;
        }
        assert_eq!(store.run_events("run_a").await.unwrap(), stored(&a), "{name}");
        assert_eq!(store.run_events("run_b").await.unwrap(), stored(&b), "{name}");
    }
}

#[tokio::test]
async fn a_sessions_runs_come_oldest_first_and_only_its_own() {
    for Backend { name, store, _dir } in backends().await {
        for (n, (id, session)) in
            [("run_a1", "a"), ("run_b1", "b"), ("run_a2", "a"), ("run_a3", "a")]
                .into_iter()
                .enumerate()
        {
            let mut run = new_run(id, 1_000 + n as i64);
            run.session_key = session.into();
            store.insert_run(run).await;
        }
        let ids = |runs: Vec<RunRecord>| runs.into_iter().map(|r| r.run_id).collect::<Vec<_>>();
        let a = store.session_runs(&"a".into(), 100).await.unwrap();
        assert_eq!(ids(a), ["run_a1", "run_a2", "run_a3"], "{name}");
        let first_two = store.session_runs(&"a".into(), 2).await.unwrap();
        assert_eq!(ids(first_two), ["run_a1", "run_a2"], "{name}");
        assert!(store.session_runs(&"c".into(), 100).await.unwrap().is_empty(), "{name}");
    }
}

#[tokio::test]
async fn list_runs_is_newest_first_with_status_filter_and_limit() {
    for Backend { name, store, _dir } in backends().await {
        for (n, id) in ["run_1", "run_2", "run_3", "run_4", "run_5"].into_iter().enumerate() {
            store.insert_run(new_run(id, 1_000 + n as i64)).await;
        }
        store.mark_running(run_id("run_2"), "echo".to_owned(), 1_100).await;
        store.mark_running(run_id("run_4"), "echo".to_owned(), 1_100).await;
        store.finalize_run(finished("run_3", Completion::success("done", None))).await;

        let ids = |runs: Vec<RunRecord>| runs.into_iter().map(|r| r.run_id).collect::<Vec<_>>();
        let all = store.list_runs(RunFilter { status: None, limit: 100 }).await.unwrap();
        assert_eq!(ids(all), ["run_5", "run_4", "run_3", "run_2", "run_1"], "{name}");
        let two = store.list_runs(RunFilter { status: None, limit: 2 }).await.unwrap();
        assert_eq!(ids(two), ["run_5", "run_4"], "{name}");
        let running = store
            .list_runs(RunFilter { status: Some(RunStatus::Running), limit: 100 })
            .await
            .unwrap();
        assert_eq!(ids(running), ["run_4", "run_2"], "{name}");
        let queued =
            store.list_runs(RunFilter { status: Some(RunStatus::Queued), limit: 1 }).await.unwrap();
        assert_eq!(ids(queued), ["run_5"], "{name}");
        let completed = store
            .list_runs(RunFilter { status: Some(RunStatus::Completed), limit: 100 })
            .await
            .unwrap();
        assert_eq!(ids(completed), ["run_3"], "{name}");
        let failed = store
            .list_runs(RunFilter { status: Some(RunStatus::Failed), limit: 100 })
            .await
            .unwrap();
        assert_eq!(ids(failed), Vec::<String>::new(), "{name}");
        let none = store.list_runs(RunFilter { status: None, limit: 0 }).await.unwrap();
        assert_eq!(ids(none), Vec::<String>::new(), "{name}");
    }
}

#[tokio::test]
async fn runs_created_in_the_same_millisecond_list_in_insertion_order() {
    for Backend { name, store, _dir } in backends().await {
        for id in ["run_x", "run_y", "run_z"] {
            store.insert_run(new_run(id, 1_000)).await;
        }
        let runs = store.list_runs(RunFilter { status: None, limit: 10 }).await.unwrap();
        let ids: Vec<_> = runs.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(ids, ["run_z", "run_y", "run_x"], "{name}");
    }
}

#[tokio::test]
async fn chat_state_put_get_overwrite_delete() {
    for Backend { name, store, _dir } in backends().await {
        assert_eq!(
            store.get_chat_state(&SessionKey::from("s1"), 1_000).await.unwrap(),
            None,
            "{name}"
        );

        store.put_chat_state(&SessionKey::from("s1"), "claude", "tok-1", 1_000).await;
        let expected = ChatState {
            last_engine: "claude".to_owned(),
            last_resume_token: "tok-1".to_owned(),
            updated_at_ms: 1_000,
            expires_at_ms: 1_000 + DEFAULT_CHAT_STATE_TTL_MS,
        };
        assert_eq!(
            store.get_chat_state(&SessionKey::from("s1"), 1_001).await.unwrap(),
            Some(expected),
            "{name}"
        );

        store.put_chat_state(&SessionKey::from("s1"), "codex", "tok-2", 2_000).await;
        store.put_chat_state(&SessionKey::from("s2"), "echo", "tok-3", 2_000).await;
        let state = store.get_chat_state(&SessionKey::from("s1"), 2_001).await.unwrap().unwrap();
        assert_eq!(
            (state.last_engine.as_str(), state.last_resume_token.as_str()),
            ("codex", "tok-2"),
            "{name}"
        );
        assert_eq!(state.expires_at_ms, 2_000 + DEFAULT_CHAT_STATE_TTL_MS, "{name}");

        store.delete_chat_state(&SessionKey::from("s1")).await;
        assert_eq!(
            store.get_chat_state(&SessionKey::from("s1"), 2_002).await.unwrap(),
            None,
            "{name}"
        );
        assert!(
            store.get_chat_state(&SessionKey::from("s2"), 2_002).await.unwrap().is_some(),
            "{name}"
        );
    }
}

#[tokio::test]
async fn chat_state_expires_after_its_ttl() {
    for Backend { name, store, _dir } in backends().await {
        store.put_chat_state(&SessionKey::from("s1"), "claude", "tok-1", 1_000).await;
        let expiry = 1_000 + DEFAULT_CHAT_STATE_TTL_MS;
        assert!(
            store.get_chat_state(&SessionKey::from("s1"), expiry - 1).await.unwrap().is_some(),
            "{name}"
        );
        assert_eq!(
            store.get_chat_state(&SessionKey::from("s1"), expiry).await.unwrap(),
            None,
            "{name}"
        );
        // Expired state stays gone even when asked about an earlier moment.
        store.flush().await.unwrap();
        assert_eq!(
            store.get_chat_state(&SessionKey::from("s1"), expiry - 1).await.unwrap(),
            None,
            "{name}"
        );

        // A fresh put after expiry is visible again.
        store.put_chat_state(&SessionKey::from("s1"), "codex", "tok-2", expiry + 10).await;
        let state =
            store.get_chat_state(&SessionKey::from("s1"), expiry + 11).await.unwrap().unwrap();
        assert_eq!(state.last_resume_token, "tok-2", "{name}");
    }
}

#[tokio::test]
async fn check_writable_and_flush_succeed_on_an_open_store() {
    for Backend { name, store, _dir } in backends().await {
        store.insert_run(new_run("run_1", 1_000)).await;
        store.flush().await.unwrap_or_else(|e| panic!("{name}: {e}"));
        store.check_writable().await.unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[tokio::test]
async fn concurrent_writers_lose_nothing() {
    for Backend { name, store, _dir } in backends().await {
        let tasks: Vec<_> = (0..8)
            .map(|task| {
                let store = store.clone();
                tokio::spawn(async move {
                    for n in 0..50 {
                        let id = format!("run_{task}_{n}");
                        store.insert_run(new_run(&id, 1_000)).await;
                        store.mark_running(run_id(&id), "echo".to_owned(), 1_001).await;
                        for event in every_kind_of_event(&id) {
                            store.append_event(event).await;
                        }
                        store.finalize_run(finished(&id, Completion::success("ok", None))).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let completed = store
            .list_runs(RunFilter { status: Some(RunStatus::Completed), limit: 1_000 })
            .await
            .unwrap();
        assert_eq!(completed.len(), 400, "{name}");
        assert_eq!(
            store.run_events("run_7_49").await.unwrap(),
            stored(&every_kind_of_event("run_7_49")),
            "{name}"
        );
    }
}

// SQLite only.

#[tokio::test]
async fn sqlite_creates_missing_parent_directories() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a").join("b").join("lemon.db");
    let store = open(&path);
    store.check_writable().await.unwrap();
    store.close().await.unwrap();
    assert!(path.is_file());
}

#[tokio::test]
async fn sqlite_data_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    let completion = Completion {
        ok: true,
        answer: "kept".to_owned(),
        error: None,
        resume: Some(ResumeToken::new("echo", "tok-1")),
        usage: json!({ "output_tokens": 1 }),
        artifacts: Vec::new(),
        retried_by: None,
    };
    let before = run_to_end(&store, "run_kept", completion).await;
    let events = every_kind_of_event("run_kept");
    for event in &events {
        store.append_event(event.clone()).await;
    }
    store.put_chat_state(&SessionKey::from("s1"), "echo", "tok-1", 1_000).await;
    store.close().await.unwrap();

    let store = open(&db_path(&dir));
    assert_eq!(store.get_run("run_kept").await.unwrap(), Some(before));
    assert_eq!(store.run_events("run_kept").await.unwrap(), stored(&events));
    let state = store.get_chat_state(&SessionKey::from("s1"), 1_001).await.unwrap().unwrap();
    assert_eq!(state.last_resume_token, "tok-1");
    store.close().await.unwrap();
}

fn user_version(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("PRAGMA user_version", [], |row| row.get(0)).unwrap()
}

/// Events stored, counted in the file: a row holds one event per line.
fn n_events(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(
        "SELECT coalesce(sum(length(data) - length(replace(data, char(10), '')) + 1), 0) FROM run_events",
        [],
        |row| row.get(0),
    )
    .unwrap()
}

fn n_rows(path: &Path, table: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| row.get(0)).unwrap()
}

#[tokio::test]
async fn sqlite_reopening_applies_no_migration_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.insert_run(new_run("run_1", 1_000)).await;
    store.close().await.unwrap();
    assert_eq!(user_version(&path), SCHEMA_VERSION);

    // Migration 1 creates tables without `IF NOT EXISTS`: running it again would fail the open.
    for _ in 0..2 {
        let store = open(&path);
        assert_eq!(store.get_run("run_1").await.unwrap(), Some(queued_record("run_1", 1_000)));
        store.close().await.unwrap();
        assert_eq!(user_version(&path), SCHEMA_VERSION);
    }
}

#[tokio::test]
async fn sqlite_refuses_a_file_from_a_newer_build() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lemon.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    match SqliteStore::open(&path, DEFAULT_CHAT_STATE_TTL_MS) {
        Err(StoreError::Open { path: named, message }) => {
            assert_eq!(named, path.display().to_string());
            assert!(message.contains("newer"), "{message}");
        }
        other => panic!("expected an open error, got {other:?}"),
    }
}

#[tokio::test]
async fn sqlite_writes_queued_before_close_are_all_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.insert_run(new_run("run_burst", 1_000)).await;
    for index in 1..=5_000 {
        store
            .append_event(event(
                "run_burst",
                index,
                EventKind::Delta { seq: index, text: format!("word{index} ") },
            ))
            .await;
    }
    store.close().await.unwrap();
    assert_eq!(n_events(&path), 5_000);

    let store = open(&path);
    let events = store.run_events("run_burst").await.unwrap();
    assert_eq!(events.len(), 5_000);
    assert!(events.iter().zip(1..).all(|(e, index)| e.index == index));
    store.close().await.unwrap();
}

#[tokio::test]
async fn sqlite_dropping_without_close_keeps_queued_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.insert_run(new_run("run_dropped", 1_000)).await;
    for index in 1..=2_000 {
        store
            .append_event(event(
                "run_dropped",
                index,
                EventKind::Delta { seq: index, text: "w ".to_owned() },
            ))
            .await;
    }
    drop(store);
    assert_eq!(n_rows(&path, "runs"), 1);
    assert_eq!(n_events(&path), 2_000);
}

/// Writes nobody waits for are gathered for a moment (the writer's linger),
/// then committed on their own: another connection to the file sees them
/// without a flush, a read or a close.
#[tokio::test]
async fn sqlite_commits_unawaited_writes_without_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.insert_run(new_run("run_lingering", 1_000)).await;
    store
        .append_event(event("run_lingering", 1, EventKind::Delta { seq: 1, text: "a".into() }))
        .await;
    crate::testing::within("the writes to commit by themselves", async {
        while n_rows(&path, "runs") == 0 || n_events(&path) == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    })
    .await;
    // A flush right after a write is answered once that write committed.
    store.kv_put("test", "k", json!(1), None).await;
    store.flush().await.unwrap();
    assert_eq!(n_rows(&path, "kv"), 1);
    store.close().await.unwrap();
}

#[tokio::test]
async fn sqlite_after_close_reads_fail_and_writes_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.insert_run(new_run("run_1", 1_000)).await;
    store.close().await.unwrap();
    // Closing twice is harmless.
    store.close().await.unwrap();

    assert_eq!(store.get_run("run_1").await, Err(StoreError::Closed));
    assert_eq!(
        store.list_runs(RunFilter { status: None, limit: 1 }).await,
        Err(StoreError::Closed)
    );
    assert_eq!(store.run_events("run_1").await, Err(StoreError::Closed));
    assert_eq!(store.get_chat_state(&SessionKey::from("s1"), 1).await, Err(StoreError::Closed));
    assert_eq!(store.flush().await, Err(StoreError::Closed));
    assert_eq!(store.check_writable().await, Err(StoreError::Closed));

    store.insert_run(new_run("run_2", 1_000)).await;
    store.mark_running(run_id("run_1"), "echo".to_owned(), 1).await;
    store.append_event(event("run_1", 1, EventKind::Phase(RunPhase::Accepted))).await;
    store.finalize_run(finished("run_1", Completion::success("x", None))).await;
    store.put_chat_state(&SessionKey::from("s1"), "echo", "tok", 1).await;
    store.delete_chat_state(&SessionKey::from("s1")).await;
    drop(store);

    assert_eq!(n_rows(&path, "runs"), 1);
    assert_eq!(n_events(&path), 0);
    assert_eq!(n_rows(&path, "chat_state"), 0);
}

// SQLite with no writer thread.

/// A paused current-thread runtime with a timer an hour away: if the runtime
/// ever waits idle, paused time jumps to that timer.
fn paused_with_a_timer_pending() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap()
}

#[test]
fn sqlite_inline_never_lets_paused_time_move() {
    let runtime = paused_with_a_timer_pending();
    runtime.block_on(async {
        let _timer = tokio::spawn(tokio::time::sleep(std::time::Duration::from_secs(3_600)));
        let start = tokio::time::Instant::now();
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(&dir);
        let store = open_inline(&path);
        let record = run_to_end(&store, "run_1", Completion::success("ok", None)).await;
        assert_eq!(record.status, RunStatus::Completed);
        store.journal_admit(journal_entry("run_2", 1)).await;
        assert_eq!(store.journal_pending().await.unwrap().len(), 1);
        store.kv_put("ns", "k", json!(1), None).await;
        assert_eq!(store.kv_get("ns", "k", 0).await.unwrap(), Some(json!(1)));
        assert_eq!(store.kv_list("ns", 0).await.unwrap().len(), 1);
        assert_eq!(store.run_events("run_1").await.unwrap(), Vec::new());
        assert_eq!(store.list_runs(RunFilter { status: None, limit: 9 }).await.unwrap().len(), 1);
        store.check_writable().await.unwrap();
        store.close().await.unwrap();
        assert_eq!(tokio::time::Instant::now(), start, "paused time moved while the store worked");
    });
}

/// The engine and token of `session`'s row in the file itself.
fn chat_state_row(path: &Path, session: &str) -> Option<(String, String)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT last_engine, last_resume_token FROM chat_state WHERE session_key = ?1")
        .unwrap();
    let mut rows = stmt.query([session]).unwrap();
    rows.next().unwrap().map(|row| (row.get(0).unwrap(), row.get(1).unwrap()))
}

#[test]
fn sqlite_chat_state_reads_see_queued_writes_without_committing_them() {
    let runtime = paused_with_a_timer_pending();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(&dir);
        // Inline, writes stay queued until a barrier: a read that needed the
        // writer would commit them.
        let store = open_inline(&path);
        let s1 = SessionKey::from("s1");
        let token = |state: Option<ChatState>| state.map(|s| s.last_resume_token);
        store.put_chat_state(&s1, "codex", "tok-1", 1_000).await;
        assert_eq!(
            token(store.get_chat_state(&s1, 1_001).await.unwrap()).as_deref(),
            Some("tok-1")
        );
        assert_eq!(chat_state_row(&path, "s1"), None, "the read committed the put");

        store.flush().await.unwrap();
        assert_eq!(chat_state_row(&path, "s1"), Some(("codex".into(), "tok-1".into())));
        // Committed, it is read from the file.
        assert_eq!(
            token(store.get_chat_state(&s1, 1_002).await.unwrap()).as_deref(),
            Some("tok-1")
        );

        // A newer write wins over the committed row, and a delete over both.
        store.put_chat_state(&s1, "claude", "tok-2", 2_000).await;
        let state = store.get_chat_state(&s1, 2_001).await.unwrap().unwrap();
        assert_eq!(
            (state.last_engine.as_str(), state.last_resume_token.as_str()),
            ("claude", "tok-2")
        );
        store.delete_chat_state(&s1).await;
        assert_eq!(store.get_chat_state(&s1, 2_002).await.unwrap(), None);
        assert_eq!(chat_state_row(&path, "s1"), Some(("codex".into(), "tok-1".into())));
        store.flush().await.unwrap();
        assert_eq!(chat_state_row(&path, "s1"), None);
        assert_eq!(store.get_chat_state(&s1, 2_003).await.unwrap(), None);

        // What was queued at close is in the file at the next open.
        store.put_chat_state(&s1, "echo", "tok-3", 3_000).await;
        store.close().await.unwrap();
        assert_eq!(store.get_chat_state(&s1, 3_001).await, Err(StoreError::Closed));
        let reopened = open(&path);
        assert_eq!(
            token(reopened.get_chat_state(&s1, 3_002).await.unwrap()).as_deref(),
            Some("tok-3")
        );
        reopened.close().await.unwrap();
    });
}

#[test]
fn sqlite_inline_applies_writes_at_a_barrier_or_a_full_batch() {
    let runtime = paused_with_a_timer_pending();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(&dir);
        let store = open_inline(&path);
        // More than the queue holds, with no barrier: full batches apply themselves.
        for n in 0..10_000 {
            store.kv_put("ns", &format!("k{n:05}"), json!(n), None).await;
        }
        // Two batches of 4 096 are committed; the rest waits for a barrier.
        assert_eq!(n_rows(&path, "kv"), 8_192);
        store.flush().await.unwrap();
        assert_eq!(n_rows(&path, "kv"), 10_000);
        store.kv_delete("ns", "k00000").await;
        assert_eq!(n_rows(&path, "kv"), 10_000);
        assert_eq!(store.kv_get("ns", "k00000", 0).await.unwrap(), None);
        assert_eq!(n_rows(&path, "kv"), 9_999);
        store.close().await.unwrap();
    });
}

#[test]
fn sqlite_inline_keeps_queued_writes_when_dropped_or_closed_and_reopens_with_a_thread() {
    let runtime = paused_with_a_timer_pending();
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    runtime.block_on(async {
        let store = open_inline(&path);
        store.insert_run(new_run("run_dropped", 1_000)).await;
        store.journal_admit(journal_entry("run_dropped", 1)).await;
        drop(store);
        assert_eq!(n_rows(&path, "runs"), 1);
        assert_eq!(n_rows(&path, "journal"), 1);

        let store = open_inline(&path);
        store.insert_run(new_run("run_closed", 2_000)).await;
        store.close().await.unwrap();
        // Closed: reads fail and writes are dropped, as with a writer thread.
        assert_eq!(store.get_run("run_closed").await, Err(StoreError::Closed));
        store.insert_run(new_run("run_late", 3_000)).await;
        drop(store);
        assert_eq!(n_rows(&path, "runs"), 2);
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let store = open(&path);
        assert_eq!(
            store.get_run("run_dropped").await.unwrap(),
            Some(queued_record("run_dropped", 1_000))
        );
        assert_eq!(
            store.get_run("run_closed").await.unwrap(),
            Some(queued_record("run_closed", 2_000))
        );
        assert_eq!(store.journal_pending().await.unwrap()[0].run_id, run_id("run_dropped"));
        store.close().await.unwrap();
    });
}

#[tokio::test]
async fn sqlite_open_under_a_regular_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, "x").unwrap();
    let path = blocker.join("lemon.db");
    match SqliteStore::open(&path, DEFAULT_CHAT_STATE_TTL_MS) {
        Err(StoreError::Open { path: named, message }) => {
            assert_eq!(named, path.display().to_string());
            assert!(!message.is_empty());
        }
        other => panic!("expected an open error, got {other:?}"),
    }
}

/// Another connection to the store's file whose triggers make every insert
/// into some tables fail with "disk says no", until [`Saboteur::stop`].
struct Saboteur {
    conn: rusqlite::Connection,
    tables: Vec<String>,
}

impl Saboteur {
    fn failing_inserts(path: &Path, tables: &[&str]) -> Saboteur {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
        for table in tables {
            conn.execute_batch(&format!(
                "CREATE TRIGGER no_{table} BEFORE INSERT ON {table} BEGIN SELECT RAISE(ABORT, 'disk says no'); END;"
            ))
            .unwrap();
        }
        Saboteur { conn, tables: tables.iter().map(|t| (*t).to_owned()).collect() }
    }

    fn stop(self) {
        for table in &self.tables {
            self.conn.execute_batch(&format!("DROP TRIGGER no_{table};")).unwrap();
        }
    }
}

#[tokio::test]
async fn sqlite_write_errors_fail_flush_and_check_writable_until_writes_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.check_writable().await.unwrap();

    // Another connection makes event inserts and health writes fail.
    let saboteur = Saboteur::failing_inserts(&path, &["run_events", "health"]);

    store.insert_run(new_run("run_1", 1_000)).await;
    store.append_event(event("run_1", 1, EventKind::Phase(RunPhase::Accepted))).await;
    match store.flush().await {
        Err(StoreError::Database(message)) => {
            assert!(message.contains("disk says no"), "{message}")
        }
        other => panic!("expected a database error, got {other:?}"),
    }
    assert!(matches!(store.check_writable().await, Err(StoreError::Database(_))));
    // The failing write did not take the rest of its batch down, and reads still work.
    assert_eq!(store.get_run("run_1").await.unwrap(), Some(queued_record("run_1", 1_000)));
    assert_eq!(store.run_events("run_1").await.unwrap(), vec![]);

    saboteur.stop();
    store.check_writable().await.unwrap();
    store.append_event(event("run_1", 1, EventKind::Phase(RunPhase::Accepted))).await;
    store.flush().await.unwrap();
    assert_eq!(store.run_events("run_1").await.unwrap().len(), 1);
    store.close().await.unwrap();
}

#[test]
fn sqlite_waits_for_a_lock_in_short_steps_and_gives_up_after_five_seconds() {
    use super::sqlite::busy_delay;
    use std::time::Duration;
    // A lock held for a fraction of a millisecond costs about that long.
    let first_ten_ms: Duration = (0..200).map(|n| busy_delay(n).unwrap()).sum();
    assert_eq!(first_ten_ms, Duration::from_millis(10));
    assert!((0..200).all(|n| busy_delay(n) == Some(Duration::from_micros(50))));
    // Then a try each millisecond, until five seconds are spent.
    let tries = (0..).take_while(|n| busy_delay(*n).is_some()).count();
    let waited: Duration = (0..tries).map(|n| busy_delay(n as u32).unwrap()).sum();
    assert_eq!(waited, Duration::from_secs(5));
    assert_eq!(busy_delay(u32::MAX), None);
}

#[tokio::test]
async fn sqlite_a_lock_another_process_keeps_fails_writes_after_the_wait_and_then_frees_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.check_writable().await.unwrap();

    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE; DELETE FROM health;").unwrap();
    // The writer waits out its five seconds and says why it could not write.
    match store.check_writable().await {
        Err(StoreError::Database(message)) => assert!(message.contains("locked"), "{message}"),
        other => panic!("expected a database error, got {other:?}"),
    }
    other.execute_batch("COMMIT;").unwrap();
    store.check_writable().await.unwrap();
    store.insert_run(new_run("run_1", 1_000)).await;
    store.flush().await.unwrap();
    assert_eq!(store.get_run("run_1").await.unwrap(), Some(queued_record("run_1", 1_000)));
    store.close().await.unwrap();
}

#[tokio::test]
async fn sqlite_a_chat_state_whose_write_failed_is_read_from_the_file_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    let s1 = SessionKey::from("s1");
    store.put_chat_state(&s1, "claude", "tok-1", 1_000).await;
    store.flush().await.unwrap();
    let token = |state: Option<ChatState>| state.map(|s| s.last_resume_token);
    assert_eq!(token(store.get_chat_state(&s1, 2_000).await.unwrap()), Some("tok-1".into()));

    let saboteur = Saboteur::failing_inserts(&path, &["chat_state"]);
    store.put_chat_state(&s1, "codex", "tok-2", 3_000).await;
    assert!(store.flush().await.is_err());
    assert_eq!(
        token(store.get_chat_state(&s1, 4_000).await.unwrap()),
        Some("tok-1".into()),
        "what the file holds, not the write that failed"
    );

    saboteur.stop();
    store.put_chat_state(&s1, "codex", "tok-3", 5_000).await;
    store.flush().await.unwrap();
    assert_eq!(token(store.get_chat_state(&s1, 6_000).await.unwrap()), Some("tok-3".into()));
    store.close().await.unwrap();
    let reopened = open(&path);
    assert_eq!(token(reopened.get_chat_state(&s1, 6_000).await.unwrap()), Some("tok-3".into()));
    reopened.close().await.unwrap();
}

#[tokio::test]
async fn sqlite_runs_from_before_a_reopen_take_new_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.insert_run(new_run("run_old", 1_000)).await;
    store.insert_run(new_run("run_done", 1_001)).await;
    store.finalize_run(finished("run_done", Completion::success("done", None))).await;
    store.append_event(event("run_old", 1, EventKind::Phase(RunPhase::Accepted))).await;
    store.close().await.unwrap();

    // The writer of the new store knows nothing of these runs yet.
    let store = open(&path);
    store.mark_running(run_id("run_old"), "echo".to_owned(), 1_500).await;
    store.mark_running(run_id("run_done"), "echo".to_owned(), 1_500).await;
    store.append_event(event("run_old", 2, EventKind::Phase(RunPhase::Dispatched))).await;
    store.insert_run(new_run("run_new", 1_002)).await;
    store.finalize_run(finished("run_old", Completion::success("late", None))).await;

    let old = store.get_run("run_old").await.unwrap().unwrap();
    assert_eq!((old.status, old.answer.as_deref()), (RunStatus::Completed, Some("late")));
    assert_eq!(old.started_at_ms, Some(1_500));
    let done = store.get_run("run_done").await.unwrap().unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    let indexes: Vec<_> =
        store.run_events("run_old").await.unwrap().into_iter().map(|e| e.index).collect();
    assert_eq!(indexes, [1, 2]);
    let listed = store.list_runs(RunFilter { status: None, limit: 10 }).await.unwrap();
    let ids: Vec<_> = listed.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run_new", "run_done", "run_old"]);
    store.close().await.unwrap();
}

#[tokio::test]
async fn events_before_the_run_is_inserted_stay_with_it() {
    for Backend { name, store, _dir } in backends().await {
        store.append_event(event("run_early", 1, EventKind::Phase(RunPhase::Accepted))).await;
        store.insert_run(new_run("run_other", 1_000)).await;
        store.flush().await.unwrap();
        store.insert_run(new_run("run_early", 1_000)).await;
        store.append_event(event("run_early", 2, EventKind::Phase(RunPhase::Dispatched))).await;
        let indexes: Vec<_> =
            store.run_events("run_early").await.unwrap().into_iter().map(|e| e.index).collect();
        assert_eq!(indexes, [1, 2], "{name}");
        // Inserted last, so listed first among runs of the same millisecond.
        let listed = store.list_runs(RunFilter { status: None, limit: 10 }).await.unwrap();
        let ids: Vec<_> = listed.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(ids, ["run_early", "run_other"], "{name}");
    }
}

/// One step of a random history, on one of a few runs.
#[derive(Debug, Clone)]
enum Step {
    Insert(usize),
    Start(usize),
    Event(usize, u8),
    Finish(usize, u8),
    /// Ends the SQLite writer's batch here, so histories cover both writes folded
    /// into one batch and writes spread over several.
    Flush,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        2 => (0..4_usize).prop_map(Step::Insert),
        2 => (0..4_usize).prop_map(Step::Start),
        4 => (0..4_usize, any::<u8>()).prop_map(|(run, kind)| Step::Event(run, kind)),
        2 => (0..4_usize, 0..3_u8).prop_map(|(run, outcome)| Step::Finish(run, outcome)),
        1 => Just(Step::Flush),
    ]
}

/// Applies `steps` to the memory backend and to `sqlite` (an empty store of
/// another backend) and checks that they end up the same. Runs are inserted at
/// most once and event indexes grow, which is how the gateway writes.
async fn check_backends_agree(steps: Vec<Step>, sqlite: StoreHandle) {
    let memory = StoreHandle::memory();
    let ids = ["run_a", "run_b", "run_c", "run_d"];
    let mut inserted = [false; 4];
    let mut next_index = [1_u64; 4];
    for (clock, step) in (0_i64..).zip(&steps) {
        for store in [&memory, &sqlite] {
            match step.clone() {
                Step::Insert(run) if !inserted[run] => {
                    // Halving the clock makes runs share a millisecond now and then;
                    // every other run continues a session.
                    let resumed_from =
                        (clock % 2 == 1).then(|| ResumeToken::new("echo", format!("tok-{clock}")));
                    let run = NewRun { resumed_from, ..new_run(ids[run], 1_000 + clock / 2) };
                    store.insert_run(run).await;
                }
                Step::Insert(_) => {}
                Step::Start(run) => {
                    store.mark_running(run_id(ids[run]), format!("engine-{clock}"), clock).await;
                }
                Step::Event(run, kind) => {
                    let index = next_index[run];
                    let kinds = every_kind_of_event(ids[run]);
                    let kind = kinds[usize::from(kind) % kinds.len()].kind.clone();
                    store.append_event(event(ids[run], index, kind)).await;
                }
                Step::Finish(run, outcome) => {
                    let completion = match outcome {
                        0 => Completion::success(format!("answer {clock}"), None),
                        1 => {
                            Completion::failure(RunError::Engine { message: "no".to_owned() }, None)
                        }
                        _ => Completion::failure(RunError::UserRequested, None),
                    };
                    store.finalize_run(finished(ids[run], completion)).await;
                }
                Step::Flush => store.flush().await.unwrap(),
            }
        }
        match *step {
            Step::Insert(run) => inserted[run] = true,
            Step::Event(run, _) => next_index[run] += 1,
            _ => {}
        }
    }
    for id in ids {
        assert_eq!(sqlite.get_run(id).await.unwrap(), memory.get_run(id).await.unwrap(), "{id}");
        assert_eq!(
            sqlite.run_events(id).await.unwrap(),
            memory.run_events(id).await.unwrap(),
            "{id}"
        );
    }
    let statuses = [
        None,
        Some(RunStatus::Queued),
        Some(RunStatus::Running),
        Some(RunStatus::Completed),
        Some(RunStatus::Failed),
        Some(RunStatus::Cancelled),
    ];
    for status in statuses {
        let filter = RunFilter { status, limit: 3 };
        assert_eq!(
            sqlite.list_runs(filter.clone()).await.unwrap(),
            memory.list_runs(filter).await.unwrap(),
            "{status:?}"
        );
    }
    sqlite.close().await.unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    #[test]
    fn sqlite_agrees_with_memory_on_any_history(steps in proptest::collection::vec(step(), 0..40)) {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(check_backends_agree(steps, open(&db_path(&dir))));
    }

    #[test]
    fn inline_sqlite_agrees_with_memory_on_any_history(steps in proptest::collection::vec(step(), 0..40)) {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(check_backends_agree(steps, open_inline(&db_path(&dir))));
    }
}

proptest::proptest! {
    // A database each case: fewer cases than SQLite's.
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(16))]

    #[test]
    fn postgres_agrees_with_memory_on_any_history(steps in proptest::collection::vec(step(), 0..40)) {
        if let Some(server) = postgres::testing::server_url() {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let url = postgres::testing::fresh_database(&server).await;
                check_backends_agree(steps, open_postgres(&url).await).await;
            });
        }
    }
}

fn journal_entry(id: &str, seq: u64) -> JournalEntry {
    JournalEntry {
        seq,
        run_id: run_id(id),
        session_key: "s1".into(),
        conversation: "resume:codex:t-1".to_owned(),
        prompt: "fix the test".to_owned(),
        engine: "codex".to_owned(),
        resume: Some(ResumeToken::new("codex", "t-1")),
        cwd: Some(PathBuf::from("/srv/app")),
        meta: json!({ "origin": "channel" }),
        route: JournalRoute {
            origin: Some("channel".to_owned()),
            queue_mode: Some("followup".to_owned()),
            auto_resume: true,
            chosen_engine: Some("codex".to_owned()),
            fallback_engine: None,
            ..JournalRoute::default()
        },
        state: JournalState::Queued,
        accepted_at_ms: 1_000 + seq as i64,
    }
}

#[tokio::test]
async fn journal_keeps_unfinished_requests_in_acceptance_order() {
    for Backend { name, store, _dir } in backends().await {
        store.journal_admit(journal_entry("j3", 3)).await;
        store.journal_admit(journal_entry("j1", 1)).await;
        store.journal_admit(journal_entry("j2", 2)).await;
        store.journal_mark_started(&run_id("j1")).await;
        store.journal_mark_started(&run_id("unknown")).await;
        store.journal_complete(&run_id("j2")).await;
        // A rewrite (a merged followup) replaces the entry by run id.
        let mut merged = journal_entry("j3", 3);
        merged.prompt = "fix the test\nand the docs".to_owned();
        store.journal_admit(merged.clone()).await;
        let pending = store.journal_pending().await.unwrap();
        let mut started = journal_entry("j1", 1);
        started.state = JournalState::Started;
        assert_eq!(pending, [started, merged], "{name}");
    }
}

#[tokio::test]
async fn sqlite_journal_survives_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    let mut bare = journal_entry("j-bare", 7);
    bare.resume = None;
    bare.cwd = None;
    store.journal_admit(bare.clone()).await;
    store.journal_admit(journal_entry("j-full", 8)).await;
    store.close().await.unwrap();
    let store = open(&db_path(&dir));
    assert_eq!(store.journal_pending().await.unwrap(), [bare, journal_entry("j-full", 8)]);
    store.close().await.unwrap();
}

#[tokio::test]
async fn inserting_a_run_again_keeps_its_place_and_creation_time() {
    for Backend { name, store, _dir } in backends().await {
        store.insert_run(new_run("run_a", 1_000)).await;
        store.insert_run(new_run("run_b", 1_001)).await;
        // Same run, sent on later (the router admitted it, the gateway inserts it again).
        let again = NewRun { engine: "claude".to_owned(), ..new_run("run_a", 5_000) };
        store.insert_run(again).await;
        let runs = store.list_runs(RunFilter { status: None, limit: 10 }).await.unwrap();
        let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(ids, ["run_b", "run_a"], "{name}: listed once, in its first place");
        let a = store.get_run("run_a").await.unwrap().unwrap();
        assert_eq!((a.created_at_ms, a.engine.as_str()), (1_000, "claude"), "{name}");
    }
}

// Small records (`kv_*`), both backends.

#[tokio::test]
async fn kv_put_get_overwrite_delete() {
    for Backend { name, store, _dir } in backends().await {
        assert_eq!(store.kv_get("offsets", "bot-1", 1_000).await.unwrap(), None, "{name}");
        store.kv_put("offsets", "bot-1", json!({ "update_id": 41 }), None).await;
        assert_eq!(
            store.kv_get("offsets", "bot-1", 1_000).await.unwrap(),
            Some(json!({ "update_id": 41 })),
            "{name}"
        );
        store.kv_put("offsets", "bot-1", json!(42), None).await;
        assert_eq!(
            store.kv_get("offsets", "bot-1", 1_000).await.unwrap(),
            Some(json!(42)),
            "{name}"
        );

        // Namespaces are separate: the same key elsewhere is another record.
        store.kv_put("deliveries", "bot-1", json!("other"), None).await;
        assert_eq!(
            store.kv_get("offsets", "bot-1", 1_000).await.unwrap(),
            Some(json!(42)),
            "{name}"
        );

        store.kv_delete("offsets", "bot-1").await;
        store.kv_delete("offsets", "never-written").await;
        assert_eq!(store.kv_get("offsets", "bot-1", 1_000).await.unwrap(), None, "{name}");
        assert_eq!(
            store.kv_get("deliveries", "bot-1", 1_000).await.unwrap(),
            Some(json!("other")),
            "{name}"
        );
    }
}

#[tokio::test]
async fn kv_records_expire_at_their_deadline() {
    for Backend { name, store, _dir } in backends().await {
        store.kv_put("keys", "k", json!({ "run_id": "r1" }), Some(2_000)).await;
        assert!(store.kv_get("keys", "k", 1_999).await.unwrap().is_some(), "{name}");
        assert_eq!(store.kv_get("keys", "k", 2_000).await.unwrap(), None, "{name}");
        // The expired record is gone, even when asked about an earlier moment.
        store.flush().await.unwrap();
        assert_eq!(store.kv_get("keys", "k", 1_000).await.unwrap(), None, "{name}");

        // Putting it again (with a later deadline, or none) brings it back.
        store.kv_put("keys", "k", json!(2), Some(5_000)).await;
        assert_eq!(store.kv_get("keys", "k", 4_999).await.unwrap(), Some(json!(2)), "{name}");
        store.kv_put("keys", "k", json!(3), None).await;
        assert_eq!(store.kv_get("keys", "k", i64::MAX).await.unwrap(), Some(json!(3)), "{name}");
    }
}

#[tokio::test]
async fn kv_list_holds_unexpired_records_of_one_namespace_by_key() {
    for Backend { name, store, _dir } in backends().await {
        assert_eq!(store.kv_list("pending", 0).await.unwrap(), [], "{name}");
        store.kv_put("pending", "c", json!({ "n": 3 }), None).await;
        store.kv_put("pending", "a", json!({ "n": 1 }), Some(10_000)).await;
        store.kv_put("pending", "b", json!({ "n": 2 }), Some(500)).await;
        store.kv_put("other", "0", json!(0), None).await;
        let listed = store.kv_list("pending", 400).await.unwrap();
        let keys: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"], "{name}");
        assert_eq!(listed[2].1, json!({ "n": 3 }), "{name}");
        let listed = store.kv_list("pending", 500).await.unwrap();
        let keys: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "c"], "{name}: b expired at 500");
        assert_eq!(store.kv_list("other", 500).await.unwrap(), [("0".to_owned(), json!(0))]);
    }
}

#[tokio::test]
async fn kv_values_keep_their_json_exactly() {
    for Backend { name, store, _dir } in backends().await {
        let value = json!({
            "text": "wörld \u{1f34b} \"quoted\"\nsecond line",
            "n": -7,
            "f": 1.5,
            "list": [null, true, { "deep": [] }],
        });
        store.kv_put("ns", "key with spaces/and:colons", value.clone(), None).await;
        let got = store.kv_get("ns", "key with spaces/and:colons", 0).await.unwrap();
        assert_eq!(got, Some(value), "{name}");
    }
}

#[tokio::test]
async fn sqlite_kv_records_survive_close_and_reopen_until_they_expire() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.kv_put("telegram_offsets", "bot-7", json!({ "offset": 1_234 }), None).await;
    store
        .kv_put("webhook_idempotency:zap", "order-17", json!({ "status": 202 }), Some(9_000))
        .await;
    store.kv_put("gone", "k", json!(1), None).await;
    store.kv_delete("gone", "k").await;
    store.close().await.unwrap();

    let store = open(&path);
    assert_eq!(
        store.kv_get("telegram_offsets", "bot-7", 8_000).await.unwrap(),
        Some(json!({ "offset": 1_234 }))
    );
    assert_eq!(
        store.kv_list("webhook_idempotency:zap", 8_999).await.unwrap(),
        [("order-17".to_owned(), json!({ "status": 202 }))]
    );
    assert_eq!(store.kv_get("gone", "k", 0).await.unwrap(), None);
    assert_eq!(store.kv_get("webhook_idempotency:zap", "order-17", 9_000).await.unwrap(), None);
    store.close().await.unwrap();
}

#[tokio::test]
async fn sqlite_reading_purges_expired_kv_rows_a_batch_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    let n_expiring = KV_PURGE_BATCH + 10;
    for n in 0..n_expiring {
        store.kv_put("keys", &format!("k{n:03}"), json!(n), Some(1_000 + n as i64)).await;
    }
    store.kv_put("keys", "forever", json!("kept"), None).await;
    store.kv_put("keys", "later", json!("kept"), Some(1_000_000)).await;
    store.flush().await.unwrap();
    assert_eq!(n_rows(&path, "kv"), n_expiring as i64 + 2);

    // A read at a time when everything but two has expired purges one batch,
    // oldest expiry first; the next read purges the rest.
    assert_eq!(store.kv_get("keys", "forever", 500_000).await.unwrap(), Some(json!("kept")));
    store.flush().await.unwrap();
    assert_eq!(n_rows(&path, "kv"), 10 + 2);
    assert_eq!(store.kv_list("keys", 500_000).await.unwrap().len(), 2);
    store.flush().await.unwrap();
    assert_eq!(n_rows(&path, "kv"), 2);
    store.close().await.unwrap();
}

#[tokio::test]
async fn sqlite_a_file_from_before_the_kv_table_is_migrated_and_keeps_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    // Make the file look like one written before migration 3.
    older_file_with_a_run(&path, &format!("{UNDO_SPEND} {UNDO_RESUMED_FROM} DROP TABLE kv;"), 2)
        .await;

    let store = open(&path);
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    assert_eq!(store.get_run("run_old").await.unwrap(), Some(queued_record("run_old", 1_000)));
    store.kv_put("ns", "k", json!(1), None).await;
    assert_eq!(store.kv_get("ns", "k", 0).await.unwrap(), Some(json!(1)));
    store.close().await.unwrap();
}

/// Writes a file at `path` holding the queued run `run_old`, then makes it
/// look like one of schema `version` (5 or older): `undo` takes out what
/// came later, after migration 6 (the session index) is undone here.
async fn older_file_with_a_run(path: &Path, undo: &str, version: u32) {
    let store = open(path);
    store.insert_run(new_run("run_old", 1_000)).await;
    store.close().await.unwrap();
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(&format!(
        "{UNDO_STAGES} {UNDO_RETENTION} DROP INDEX runs_by_session; {undo} PRAGMA user_version = {version};"
    ))
    .unwrap();
}

/// Undoes migration 8 (the stage stamps).
const UNDO_STAGES: &str = "ALTER TABLE runs DROP COLUMN stages;";

/// Undoes migration 7 (retention's column, table and indexes).
const UNDO_RETENTION: &str = "DROP INDEX runs_uncompacted; ALTER TABLE runs DROP COLUMN compacted;
     DROP TABLE pruned_usage; DROP INDEX kv_unexpired_by_key;";

/// Undoes migration 5 (the spend columns and their indexes), to make a file look older.
const UNDO_SPEND: &str = "DROP INDEX runs_completed; DROP INDEX runs_session_completed;
     ALTER TABLE runs DROP COLUMN input_tokens; ALTER TABLE runs DROP COLUMN output_tokens;
     ALTER TABLE runs DROP COLUMN cache_read_tokens; ALTER TABLE runs DROP COLUMN cache_write_tokens;
     ALTER TABLE runs DROP COLUMN cost_usd;";

#[tokio::test]
async fn sqlite_a_file_from_before_spend_is_migrated_and_sums_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    older_file_with_a_run(&path, UNDO_SPEND, 4).await;

    let store = open(&path);
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    assert_eq!(store.get_run("run_old").await.unwrap(), Some(queued_record("run_old", 1_000)));
    store.finalize_run(finished("run_old", Completion::success("ok", None))).await;
    let totals = store.usage().usage_totals(&UsageFilter::default()).await.unwrap();
    assert_eq!(totals, UsageTotals { runs: 1, spend: RunSpend::default() });
    store.close().await.unwrap();
}

#[tokio::test]
async fn usage_sums_finished_runs_since_a_time_by_session_and_engine() {
    for Backend { name, store, _dir } in backends().await {
        let spend = |tokens: u64, usd: f64| RunSpend {
            input_tokens: tokens,
            output_tokens: 1,
            cache_read_tokens: 2,
            cache_write_tokens: 3,
            usd,
        };
        let runs = [
            ("u1", "s1", "echo", 1_000, spend(10, 0.5)),
            ("u2", "s1", "codex", 2_000, spend(20, 0.25)),
            ("u3", "s2", "codex", 3_000, spend(40, 1.0)),
        ];
        for (id, session, engine, at, spend) in runs {
            let run = NewRun { session_key: session.into(), ..new_run(id, at - 100) };
            store.insert_run(run).await;
            let done = FinishedRun {
                engine: engine.to_owned(),
                completed_at_ms: at,
                spend,
                ..finished(id, Completion::success("ok", None))
            };
            store.finalize_run(done).await;
        }
        // Still running: not counted.
        store.insert_run(new_run("u4", 2_500)).await;
        let record = store.get_run("u2").await.unwrap().unwrap();
        assert_eq!(record.spend, spend(20, 0.25), "{name}");

        let all = store.usage().usage_totals(&UsageFilter::default()).await.unwrap();
        assert_eq!(all.runs, 3, "{name}");
        assert_eq!(all.spend.input_tokens, 70, "{name}");
        assert_eq!(all.spend.cache_write_tokens, 9, "{name}");
        assert!((all.spend.usd - 1.75).abs() < 1e-9, "{name}");
        let since = UsageFilter { since_ms: 2_000, ..UsageFilter::default() };
        assert_eq!(store.usage().usage_totals(&since).await.unwrap().runs, 2, "{name}");
        let session = UsageFilter { session_key: Some("s1".into()), since_ms: 1_500, engine: None };
        let totals = store.usage().usage_totals(&session).await.unwrap();
        assert_eq!((totals.runs, totals.spend.input_tokens), (1, 20), "{name}");
        let engine = UsageFilter { engine: Some("codex".to_owned()), ..UsageFilter::default() };
        assert_eq!(store.usage().usage_totals(&engine).await.unwrap().runs, 2, "{name}");

        let by_engine = store.usage().usage_by(&UsageFilter::default(), UsageGroup::Engine).await;
        let by_engine: Vec<(String, u64)> =
            by_engine.unwrap().into_iter().map(|(key, t)| (key, t.runs)).collect();
        assert_eq!(by_engine, [("codex".to_owned(), 2), ("echo".to_owned(), 1)], "{name}");
        let by_session = store.usage().usage_by(&since, UsageGroup::Session).await.unwrap();
        let by_session: Vec<(String, u64)> =
            by_session.into_iter().map(|(key, t)| (key, t.spend.input_tokens)).collect();
        assert_eq!(by_session, [("s1".to_owned(), 20), ("s2".to_owned(), 40)], "{name}");
    }
}

/// Undoes migration 4 (the `resumed_from` columns), to make a file look older.
const UNDO_RESUMED_FROM: &str = "ALTER TABLE runs DROP COLUMN resumed_from_engine;
     ALTER TABLE runs DROP COLUMN resumed_from_value;";

#[tokio::test]
async fn sqlite_a_file_from_before_resumed_from_is_migrated_and_keeps_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    older_file_with_a_run(&path, &format!("{UNDO_SPEND} {UNDO_RESUMED_FROM}"), 3).await;

    let store = open(&path);
    assert_eq!(user_version(&path), SCHEMA_VERSION);
    assert_eq!(store.get_run("run_old").await.unwrap(), Some(queued_record("run_old", 1_000)));
    let resumed = NewRun {
        resumed_from: Some(ResumeToken::new("echo", "tok-9")),
        ..new_run("run_new", 2_000)
    };
    store.insert_run(resumed).await;
    let record = store.get_run("run_new").await.unwrap().unwrap();
    assert_eq!(record.resumed_from, Some(ResumeToken::new("echo", "tok-9")));
    store.close().await.unwrap();
}

#[tokio::test]
async fn a_run_keeps_the_session_it_resumed_through_its_end() {
    for Backend { name, store, _dir } in backends().await {
        let from = ResumeToken::new("echo", "tok-before");
        store
            .insert_run(NewRun { resumed_from: Some(from.clone()), ..new_run("run_res", 1_000) })
            .await;
        let queued = store.get_run("run_res").await.unwrap().unwrap();
        assert_eq!(queued.resumed_from, Some(from.clone()), "{name}");
        assert_eq!(queued.resume, None, "{name}");
        store.mark_running(run_id("run_res"), "echo".to_owned(), 1_010).await;
        let after = Some(ResumeToken::new("echo", "tok-after"));
        store.finalize_run(finished("run_res", Completion::success("ok", after.clone()))).await;
        let done = store.get_run("run_res").await.unwrap().unwrap();
        assert_eq!(done.resumed_from, Some(from.clone()), "{name}");
        assert_eq!(done.resume, after, "{name}");
        let listed = store.list_runs(RunFilter { status: None, limit: 10 }).await.unwrap();
        assert_eq!(listed[0].resumed_from, Some(from), "{name}");
        // A run started without a token continued nothing.
        store.insert_run(new_run("run_fresh", 2_000)).await;
        assert_eq!(store.get_run("run_fresh").await.unwrap().unwrap().resumed_from, None, "{name}");
    }
}

#[tokio::test]
async fn inserting_a_run_again_takes_the_later_resumed_from() {
    for Backend { name, store, _dir } in backends().await {
        // The router admits without a token; the gateway inserts it again with the
        // token it was dispatched with.
        store.insert_run(new_run("run_twice", 1_000)).await;
        let token = ResumeToken::new("echo", "tok-auto");
        store
            .insert_run(NewRun { resumed_from: Some(token.clone()), ..new_run("run_twice", 1_500) })
            .await;
        let record = store.get_run("run_twice").await.unwrap().unwrap();
        assert_eq!(record.resumed_from, Some(token), "{name}");
        assert_eq!(record.created_at_ms, 1_000, "{name}");
    }
}

#[tokio::test]
async fn journal_route_round_trips_on_every_backend() {
    for Backend { name, store, _dir } in backends().await {
        let entry = journal_entry("j_route", 1);
        store.journal_admit(entry.clone()).await;
        let pending = store.journal().journal_pending().await.unwrap();
        assert_eq!(pending, vec![entry], "{name}");
    }
}

/// Rewrites the stored route of journal entry `run_id` to `route` (raw text).
fn set_stored_route(path: &Path, run_id: &str, route: &str) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute(
        "UPDATE journal SET route = ?1 WHERE run_id = ?2",
        rusqlite::params![route, run_id],
    )
    .unwrap();
}

#[tokio::test]
async fn sqlite_journal_routes_of_older_and_newer_builds_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    for (id, seq) in [("j_old", 1), ("j_new", 2), ("j_odd", 3), ("j_empty", 4)] {
        store.journal_admit(journal_entry(id, seq)).await;
    }
    store.close().await.unwrap();
    // As the first builds wrote it: some keys, no fallback engine.
    set_stored_route(
        &path,
        "j_old",
        r#"{"origin":"webhook","queue_mode":"collect","auto_resume":true}"#,
    );
    // A later build's key this one does not know.
    set_stored_route(
        &path,
        "j_new",
        r#"{"origin":"cron","auto_resume":false,"chosen_engine":"claude","priority":7}"#,
    );
    // A key of the wrong type: read as the default route.
    set_stored_route(&path, "j_odd", r#"{"auto_resume":"yes","origin":"channel"}"#);
    set_stored_route(&path, "j_empty", "{}");

    let store = open(&path);
    let routes: Vec<(String, JournalRoute)> = store
        .journal_pending()
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.run_id.to_string(), e.route))
        .collect();
    let expected = vec![
        (
            "j_old".to_owned(),
            JournalRoute {
                origin: Some("webhook".to_owned()),
                queue_mode: Some("collect".to_owned()),
                auto_resume: true,
                ..JournalRoute::default()
            },
        ),
        (
            "j_new".to_owned(),
            JournalRoute {
                origin: Some("cron".to_owned()),
                chosen_engine: Some("claude".to_owned()),
                ..JournalRoute::default()
            },
        ),
        ("j_odd".to_owned(), JournalRoute::default()),
        ("j_empty".to_owned(), JournalRoute::default()),
    ];
    assert_eq!(routes, expected);
    // A route that is not JSON at all is a corrupt entry.
    store.close().await.unwrap();
    set_stored_route(&path, "j_empty", "not json");
    let store = open(&path);
    assert!(matches!(store.journal_pending().await, Err(StoreError::Corrupt(_))));
    store.close().await.unwrap();
}

#[tokio::test]
async fn process_groups_are_recorded_listed_and_forgotten_on_every_backend() {
    for Backend { name, store, _dir } in backends().await {
        let group = ProcessGroupRecord { pgid: 4321, start_time: 987_654, session: 4000, scope: 7 };
        store.record_process_group(group).await.unwrap();
        assert_eq!(store.process_groups().await.unwrap(), vec![group], "{name}");
        // Stored as plain JSON, readable by any backend or tool.
        let raw = store.kv_get(PROCESS_GROUPS_NAMESPACE, "4321", 0).await.unwrap();
        assert_eq!(
            raw,
            Some(json!({ "pgid": 4321, "start_time": 987_654, "session": 4000, "scope": 7 })),
            "{name}"
        );
        // A record written before the scope existed reads with scope 0.
        store
            .kv_put(
                PROCESS_GROUPS_NAMESPACE,
                "4321",
                json!({ "pgid": 4321, "start_time": 987_654, "session": 4000 }),
                None,
            )
            .await;
        assert_eq!(
            store.process_groups().await.unwrap(),
            vec![ProcessGroupRecord { scope: 0, ..group }],
            "{name}"
        );
        store.record_process_group(group).await.unwrap();
        // An unreadable record is dropped, the others kept.
        store.kv_put(PROCESS_GROUPS_NAMESPACE, "77", json!({ "pgid": "x" }), None).await;
        assert_eq!(store.process_groups().await.unwrap(), vec![group], "{name}");
        assert_eq!(store.kv_get(PROCESS_GROUPS_NAMESPACE, "77", 0).await.unwrap(), None, "{name}");
        store.forget_process_group(4321).await;
        assert_eq!(store.process_groups().await.unwrap(), vec![], "{name}");
    }
}

#[tokio::test]
async fn each_concern_is_reachable_through_its_own_trait() {
    for Backend { name, store, _dir } in backends().await {
        let runs: &dyn RunStore = store.runs();
        runs.insert_run(new_run("run_view", 1_000)).await;
        let events: &dyn RunEventStore = store.events();
        let one = event("run_view", 1, EventKind::Phase(RunPhase::Dispatched));
        events.append_event(Arc::clone(&one)).await;
        let chat: &dyn ChatStateStore = store.chat_state();
        chat.put_chat_state(&SessionKey::from("sv"), "echo", "tok", 1_000).await;
        let kv: &dyn KvStore = store.kv();
        kv.kv_put("ns", "k", json!("v"), None).await;
        let journal: &dyn JournalStore = store.journal();
        journal.journal_admit(journal_entry("j_view", 1)).await;
        store.lifecycle().flush().await.unwrap();

        assert_eq!(
            runs.get_run("run_view").await.unwrap(),
            Some(queued_record("run_view", 1_000)),
            "{name}"
        );
        assert_eq!(events.run_events("run_view").await.unwrap(), stored(&[one]), "{name}");
        assert_eq!(
            chat.get_chat_state(&SessionKey::from("sv"), 1_001)
                .await
                .unwrap()
                .unwrap()
                .last_resume_token,
            "tok",
            "{name}"
        );
        assert_eq!(kv.kv_get("ns", "k", 0).await.unwrap(), Some(json!("v")), "{name}");
        assert_eq!(journal.journal_pending().await.unwrap().len(), 1, "{name}");
        store.lifecycle().check_writable().await.unwrap();
    }
}

#[tokio::test]
async fn stored_events_give_back_their_resume_token() {
    for Backend { name, store, _dir } in backends().await {
        for event in every_kind_of_event("run_tok") {
            store.append_event(event).await;
        }
        let resumes: Vec<(String, Option<ResumeToken>)> = store
            .run_events("run_tok")
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.kind.clone(), e.resume()))
            .filter(|(_, resume)| resume.is_some())
            .collect();
        let token = Some(ResumeToken::new("echo", "tok-1"));
        let expected = ["engine_started", "engine_completed", "run_completed"]
            .map(|kind| (kind.to_owned(), token.clone()));
        assert_eq!(resumes, expected, "{name}");
    }
}

/// Turns like a gateway's, one after the other (a run, its events, its end,
/// then a flush), about 140 MB of log in all: the checkpointer copies the log
/// back and it starts over from the top, and past 32 MiB the writer truncates
/// it itself, so its file stays under the 64 MiB of `journal_size_limit`
/// instead of growing to 140 MB, however slow the checkpointer thread is.
#[tokio::test]
async fn sqlite_log_starts_over_while_turns_keep_coming() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    let wal = path.with_file_name("lemon.db-wal");
    let mut largest = 0;
    for n in 0..4_000 {
        let id = format!("run_turn_{n}");
        store.insert_run(new_run(&id, 1_000 + n)).await;
        store.mark_running(run_id(&id), "echo".to_owned(), 1_010).await;
        for index in 1..=3 {
            store
                .append_event(event(&id, index, EventKind::Delta { seq: index, text: "a".into() }))
                .await;
        }
        store.finalize_run(finished(&id, Completion::success("answer", None))).await;
        store.flush().await.unwrap();
        largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
    }
    store.close().await.unwrap();
    assert!(largest > 0, "the store writes through its log");
    assert!(largest < 64 << 20, "the log's file grew to {largest} bytes");
}

// ------------------------------------------------------------ backup and restore

/// Every finished run's row, in `seq` order, as text: what a backup must keep.
fn finished_rows(path: &Path) -> Vec<String> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut statement = conn
        .prepare(
            "SELECT run_id, status, answer, usage, completed_at_ms FROM runs \
             WHERE completed_at_ms IS NOT NULL ORDER BY seq",
        )
        .unwrap();
    let rows = statement
        .query_map([], |row| {
            Ok(format!(
                "{}|{}|{:?}|{}|{:?}",
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, Option<i64>>(4)?
            ))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

/// A backup taken while runs keep finishing is one moment of the store: every
/// finished run in it matches the source row for row, in order, and the
/// source's first runs are all there; restoring it gives exactly that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_during_traffic_restores_to_the_moment_it_was_taken() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    for n in 0..300 {
        run_to_end(
            &store,
            &format!("run_before_{n}"),
            Completion::success(format!("answer {n}"), None),
        )
        .await;
    }
    store.flush().await.unwrap();
    let traffic = {
        let store = store.clone();
        tokio::spawn(async move {
            for n in 0..2_000 {
                run_to_end(&store, &format!("run_during_{n}"), Completion::success("later", None))
                    .await;
            }
        })
    };
    let copy = dir.path().join("backup.db");
    let copied = tokio::task::spawn_blocking({
        let (path, copy) = (path.clone(), copy.clone());
        move || sqlite::backup(&path, &copy)
    })
    .await
    .unwrap()
    .unwrap();
    traffic.await.unwrap();
    store.flush().await.unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777, 0o600);
    let (backed_up, source) = (finished_rows(&copy), finished_rows(&path));
    assert_eq!(copied.runs, backed_up.len() as u64);
    assert!(backed_up.len() >= 300, "the runs finished before the backup are in it");
    assert_eq!(source[..backed_up.len()], backed_up[..], "one moment of the source, row for row");
    assert_eq!(source.len(), 2_300);

    // A backup never overwrites a file.
    let again = sqlite::backup(&path, &copy).unwrap_err();
    assert!(
        again.to_string().ends_with("already exists; name a new file, or remove it first"),
        "{again}"
    );

    // While the store is open, a restore is refused and changes nothing.
    let refused = sqlite::restore(&path, &copy).unwrap_err();
    assert!(refused.to_string().contains("a gateway is running on"), "{refused}");
    assert_eq!(finished_rows(&path).len(), 2_300);
    store.close().await.unwrap();
    drop(store);

    let restored = sqlite::restore(&path, &copy).unwrap();
    assert_eq!(restored.runs, backed_up.len() as u64);
    assert_eq!(finished_rows(&path), backed_up);
    let kept = path.with_file_name("lemon.db.before-restore");
    assert_eq!(finished_rows(&kept).len(), 2_300, "the replaced store is kept");
    // The restored file opens as a store and goes on.
    let reopened = open(&path);
    run_to_end(&reopened, "run_after_restore", Completion::success("new", None)).await;
    assert!(reopened.get_run("run_before_0").await.unwrap().is_some());
    reopened.close().await.unwrap();
}

#[tokio::test]
async fn a_restore_refuses_what_is_not_a_lemon_database_and_keeps_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    run_to_end(&store, "run_kept", Completion::success("kept", None)).await;
    store.close().await.unwrap();
    drop(store);
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a database at all, just some words that go on for a while").unwrap();
    let other = dir.path().join("other.db");
    {
        let conn = rusqlite::Connection::open(&other).unwrap();
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        conn.pragma_update(None, "user_version", 2).unwrap();
    }
    let newer = dir.path().join("newer.db");
    {
        let conn = rusqlite::Connection::open(&newer).unwrap();
        conn.execute_batch("CREATE TABLE runs (x); CREATE TABLE run_events (x); CREATE TABLE journal (x); CREATE TABLE kv (x);").unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
    }
    for (file, why) in [
        (&text, "file is not a database"),
        (&other, "it lacks the gateway's tables"),
        (
            &newer,
            &format!(
                "its schema version is {}, this build reads 1 to {SCHEMA_VERSION}",
                SCHEMA_VERSION + 1
            )[..],
        ),
    ] {
        let error = sqlite::restore(&path, file).unwrap_err().to_string();
        assert!(error.contains("is not a Lemon Gateway database this build can read"), "{error}");
        assert!(error.contains(why), "{error}");
    }
    assert_eq!(finished_rows(&path).len(), 1, "the store is as it was");
    assert!(!path.with_file_name("lemon.db.before-restore").exists());
    assert!(!path.with_file_name("lemon.db.restoring").exists());
}

#[tokio::test]
async fn a_file_that_kept_its_free_pages_is_converted_once_and_keeps_its_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    run_to_end(&store, "run_kept", Completion::success("kept", None)).await;
    store.close().await.unwrap();
    drop(store);
    let mode = |path: &Path| -> i64 {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.query_row("PRAGMA auto_vacuum", [], |row| row.get(0)).unwrap()
    };
    assert_eq!(mode(&path), 2, "a new file gives pages back incrementally");
    // As files made before retention were.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA auto_vacuum = NONE; VACUUM;").unwrap();
    }
    assert_eq!(mode(&path), 0);
    let store = open(&path);
    assert_eq!(store.get_run("run_kept").await.unwrap().unwrap().answer.as_deref(), Some("kept"));
    store.close().await.unwrap();
    drop(store);
    assert_eq!(mode(&path), 2);
}

#[tokio::test]
async fn compaction_keeps_a_runs_end_and_actions_once_and_a_closed_store_refuses_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_inline(&db_path(&dir));
    let run = run_id("run_c");
    store.insert_run(new_run("run_c", 1_000)).await;
    let action = Action {
        id: "a".to_owned(),
        kind: ActionKind::Command,
        title: "ls".to_owned(),
        detail: serde_json::Value::Null,
        phase: ActionPhase::Completed,
        ok: Some(true),
        message: None,
        level: None,
        result_meta: serde_json::Value::Null,
    };
    let completion = Completion::success("listed", None);
    for (index, kind) in [
        EventKind::Delta { seq: 1, text: "listed".to_owned() },
        EventKind::EngineAction(action),
        EventKind::RunCompleted {
            completion: completion.clone(),
            engine: "echo".to_owned(),
            duration_ms: 5,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let event = BusEvent {
            run_id: run.clone(),
            session_key: "s".into(),
            index: index as u64 + 1,
            ts_ms: 1_500,
            kind,
        };
        store.append_event(Arc::new(event)).await;
    }
    store.finalize_run(finished("run_c", completion)).await;
    let step = PruneStep::Events { before_ms: 3_000, limit: 10 };
    assert_eq!(store.retention().prune(step.clone()).await.unwrap(), 1);
    assert_eq!(store.retention().prune(step).await.unwrap(), 0, "compacted once");
    let events = store.run_events("run_c").await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].data["compacted"]["events"], 3);
    assert_eq!(events[0].data["answer"], "listed");
    let record = store.get_run("run_c").await.unwrap().unwrap();
    let compacted = record.compacted.unwrap();
    assert_eq!(
        compacted.actions,
        vec![json!({"kind": "command", "title": "ls", "ok": true, "message": null})]
    );
    assert_eq!(store.retention().table_rows().await.unwrap()[0], ("runs".to_owned(), 1));
    store.close().await.unwrap();
    assert_eq!(
        store.retention().prune(PruneStep::Runs { before_ms: i64::MAX, limit: 1 }).await,
        Err(StoreError::Closed)
    );
}

#[tokio::test]
async fn many_runs_events_read_at_once_in_the_order_asked() {
    for Backend { name, store, _dir } in backends().await {
        for (id, n) in [("run_a", 2), ("run_b", 3)] {
            store.insert_run(new_run(id, 1_000)).await;
            for index in 1..=n {
                let delta = EventKind::Delta { seq: index, text: format!("{id} {index}") };
                store.append_event(event(id, index, delta)).await;
            }
        }
        let ids = ["run_b", "run_missing", "run_a"].map(str::to_owned).to_vec();
        let all = store.runs_events(ids).await.unwrap();
        let indexes: Vec<Vec<u64>> =
            all.iter().map(|events| events.iter().map(|e| e.index).collect()).collect();
        assert_eq!(indexes, vec![vec![1, 2, 3], vec![], vec![1, 2]], "{name}");
        assert_eq!(all[2][1].data["text"], "run_a 2", "{name}");
    }
}

#[tokio::test]
async fn retention_steps_keep_what_they_must_on_sqlite_and_postgres() {
    for Backend { name, store, _dir } in backends().await {
        if name == "memory" {
            // It keeps its own bound and prunes nothing.
            continue;
        }
        let spend = RunSpend { input_tokens: 10, usd: 0.5, ..RunSpend::default() };
        for (id, completed_at_ms) in [("r_old", 2_000), ("r_owed", 2_000), ("r_new", 10_000)] {
            store.insert_run(new_run(id, 1_000)).await;
            for event in every_kind_of_event(id) {
                store.append_event(event).await;
            }
            let done = FinishedRun {
                completed_at_ms,
                spend,
                ..finished(id, Completion::success("done", None))
            };
            store.finalize_run(done).await;
        }
        store.insert_run(new_run("r_live", 1_000)).await;
        store.mark_running(run_id("r_live"), "echo".to_owned(), 1_001).await;
        // A delivery still owed for r_owed.
        store.kv_put("deliveries", "r_owed", json!({ "chat": 1 }), None).await;
        let prune = |step: PruneStep| {
            let store = store.clone();
            async move { store.retention().prune(step).await.unwrap() }
        };

        let events = PruneStep::Events { before_ms: 5_000, limit: 10 };
        assert_eq!(prune(events.clone()).await, 2, "{name}: r_old and r_owed");
        assert_eq!(prune(events).await, 0, "{name}: compacted once");
        let kept = store.run_events("r_old").await.unwrap();
        assert_eq!(kept.len(), 1, "{name}");
        assert_eq!(kept[0].kind, "run_completed", "{name}");
        assert_eq!(kept[0].data["compacted"]["events"], 9, "{name}");
        let compacted = store.get_run("r_old").await.unwrap().unwrap().compacted.unwrap();
        assert_eq!(compacted.events, 9, "{name}");
        assert_eq!(
            compacted.actions,
            [json!({ "kind": "command", "title": "ls", "ok": true, "message": null })],
            "{name}"
        );
        assert_eq!(store.run_events("r_new").await.unwrap().len(), 9, "{name}: too recent");

        let runs = PruneStep::Runs { before_ms: 5_000, limit: 10 };
        assert_eq!(prune(runs.clone()).await, 1, "{name}: r_owed is owed a delivery");
        assert_eq!(prune(runs).await, 0, "{name}");
        assert_eq!(store.get_run("r_old").await.unwrap(), None, "{name}");
        assert_eq!(store.run_events("r_old").await.unwrap(), [], "{name}");
        for id in ["r_owed", "r_new", "r_live"] {
            assert!(store.get_run(id).await.unwrap().is_some(), "{name}: {id} kept");
        }
        let totals = store.usage().usage_totals(&UsageFilter::default()).await.unwrap();
        assert_eq!((totals.runs, totals.spend.input_tokens), (3, 30), "{name}: r_old still counts");

        let usage = PruneStep::Usage { before_ms: 5_000, limit: 10 };
        assert_eq!(prune(usage).await, 1, "{name}");
        let totals = store.usage().usage_totals(&UsageFilter::default()).await.unwrap();
        assert_eq!(totals.runs, 2, "{name}");

        for (key, expires_at_ms) in [("a", Some(100)), ("b", Some(200)), ("c", Some(i64::MAX))] {
            store.kv_put("keys", key, json!(key), expires_at_ms).await;
        }
        let expired = PruneStep::ExpiredRecords { now_ms: 1_000, limit: 1 };
        assert_eq!(prune(expired.clone()).await, 1, "{name}");
        assert_eq!(prune(expired.clone()).await, 1, "{name}");
        assert_eq!(prune(expired).await, 0, "{name}");

        store.kv_put("sessions", "s1", json!({ "updated_at_ms": 100 }), None).await;
        store.kv_put("sessions", "s2", json!({ "updated_at_ms": 9_000 }), None).await;
        store.kv_put("sessions", "s3", json!("no updated_at_ms here"), None).await;
        store.kv_put("sessions", "s4", json!({ "updated_at_ms": 50 }), Some(i64::MAX)).await;
        let idle = PruneStep::IdleRecords {
            namespace: "sessions".to_owned(),
            before_ms: 1_000,
            limit: 10,
        };
        assert_eq!(prune(idle).await, 1, "{name}");
        let keys: Vec<String> =
            store.kv_list("sessions", 0).await.unwrap().into_iter().map(|(key, _)| key).collect();
        assert_eq!(keys, ["s2", "s3", "s4"], "{name}");

        store.retention().prune(PruneStep::Vacuum { pages: 16 }).await.unwrap();
        let tables: Vec<String> =
            store.retention().table_rows().await.unwrap().into_iter().map(|(t, _)| t).collect();
        assert_eq!(
            tables,
            ["runs", "run_events", "pruned_usage", "journal", "kv", "chat_state"],
            "{name}"
        );
        assert_eq!(store.retention().table_rows().await.unwrap()[0].1, 3, "{name}");
        assert!(store.retention().used_bytes().await.unwrap() > 0, "{name}");
    }
}

// PostgreSQL only. Each test runs on a database of its own and is skipped
// when no server is configured (see `postgres::testing::server_url`).

fn postgres_config(url: &str) -> postgres::PostgresConfig {
    postgres::PostgresConfig {
        url: url.to_owned(),
        pool_size: 4,
        chat_state_ttl_ms: DEFAULT_CHAT_STATE_TTL_MS,
        exclusive: false,
    }
}

async fn open_postgres(url: &str) -> StoreHandle {
    StoreHandle::open_postgres(postgres_config(url)).await.unwrap()
}

/// A fresh database on the tests' server, or `None` without a server.
async fn postgres_database() -> Option<String> {
    let server = postgres::testing::server_url()?;
    Some(postgres::testing::fresh_database(&server).await)
}

/// A plain connection to `url`, beside the store's pool.
async fn plain_connection(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn count_rows(client: &tokio_postgres::Client, table: &str) -> i64 {
    client.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.unwrap().get(0)
}

async fn schema_version(client: &tokio_postgres::Client) -> i32 {
    client.query_one("SELECT version FROM lemon_schema", &[]).await.unwrap().get(0)
}

/// A gateway's store holds its database alone: a second exclusive store is
/// refused with who holds it, and can open once the first has closed; even
/// after the holder's connection was ended by the server, the holder takes
/// the lock back and a second store is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_exclusive_store_refuses_a_second_gateway_on_its_database() {
    let Some(url) = postgres_database().await else { return };
    let exclusive = || postgres::PostgresConfig { exclusive: true, ..postgres_config(&url) };
    let first = StoreHandle::open_postgres(exclusive()).await.unwrap();
    let refused = StoreHandle::open_postgres(exclusive()).await.unwrap_err().to_string();
    assert!(refused.contains("another gateway uses this database"), "{refused}");
    assert!(refused.contains("connected from 127.0.0.1 since "), "{refused}");
    assert!(!refused.contains(&password_of(&url)), "{refused}");

    // The server ends every other connection (the lock's too): the holder
    // takes the lock back on a new one before anyone else may.
    let admin = plain_connection(&url).await;
    // The pid of the backend holding the advisory lock, if one does.
    let lock_holder = || async {
        admin
            .query_opt(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
                 AND pid <> pg_backend_pid() \
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .unwrap()
            .map(|row| row.get::<_, i32>(0))
    };
    let before = lock_holder().await.expect("the first store holds the lock");
    admin
        .batch_execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .await
        .unwrap();
    // A terminated backend may still show its lock for a moment: wait for the
    // lock under a new connection.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while lock_holder().await.is_none_or(|pid| pid == before) {
        assert!(tokio::time::Instant::now() < deadline, "the lock was not taken back");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let refused = StoreHandle::open_postgres(exclusive()).await.unwrap_err().to_string();
    assert!(refused.contains("another gateway uses this database"), "{refused}");

    first.close().await.unwrap();
    let second = StoreHandle::open_postgres(exclusive()).await.unwrap();
    second.close().await.unwrap();
}

/// The password in a `postgresql://user:password@host…` string.
fn password_of(url: &str) -> String {
    let login = url.split("://").nth(1).unwrap().split('@').next().unwrap();
    login.split(':').nth(1).unwrap_or("no password").to_owned()
}

#[tokio::test]
async fn postgres_data_survives_close_and_reconnect() {
    let Some(url) = postgres_database().await else { return };
    let store = open_postgres(&url).await;
    let completion = Completion {
        ok: true,
        answer: "kept".to_owned(),
        error: None,
        resume: Some(ResumeToken::new("echo", "tok-1")),
        usage: json!({ "output_tokens": 1 }),
        artifacts: Vec::new(),
        retried_by: None,
    };
    let before = run_to_end(&store, "run_kept", completion).await;
    let events = every_kind_of_event("run_kept");
    for event in &events {
        store.append_event(event.clone()).await;
    }
    store.put_chat_state(&SessionKey::from("s1"), "echo", "tok-1", 1_000).await;
    let mut bare = journal_entry("j-bare", 7);
    bare.resume = None;
    bare.cwd = None;
    store.journal_admit(bare.clone()).await;
    store.journal_admit(journal_entry("j-full", 8)).await;
    store.kv_put("offsets", "bot-7", json!({ "offset": 1_234 }), None).await;
    store.close().await.unwrap();

    let store = open_postgres(&url).await;
    assert_eq!(store.get_run("run_kept").await.unwrap(), Some(before));
    assert_eq!(store.run_events("run_kept").await.unwrap(), stored(&events));
    let state = store.get_chat_state(&SessionKey::from("s1"), 1_001).await.unwrap().unwrap();
    assert_eq!(state.last_resume_token, "tok-1");
    assert_eq!(store.journal_pending().await.unwrap(), [bare, journal_entry("j-full", 8)]);
    assert_eq!(
        store.kv_get("offsets", "bot-7", 0).await.unwrap(),
        Some(json!({ "offset": 1_234 }))
    );
    store.close().await.unwrap();
}

#[tokio::test]
async fn postgres_two_nodes_connect_at_once_and_no_migration_runs_twice() {
    let Some(url) = postgres_database().await else { return };
    // Both find an empty database; one migrates, the other waits for it.
    let (a, b) = tokio::join!(
        postgres::PostgresStore::connect(postgres_config(&url)),
        postgres::PostgresStore::connect(postgres_config(&url)),
    );
    let (a, b) = (StoreHandle::new(Arc::new(a.unwrap())), StoreHandle::new(Arc::new(b.unwrap())));
    a.insert_run(new_run("run_1", 1_000)).await;
    a.flush().await.unwrap();
    assert_eq!(b.get_run("run_1").await.unwrap(), Some(queued_record("run_1", 1_000)));
    a.close().await.unwrap();
    b.close().await.unwrap();
    let client = plain_connection(&url).await;
    assert_eq!(schema_version(&client).await, postgres::SCHEMA_VERSION);

    // Migration 1 creates tables without `IF NOT EXISTS`: running it again would fail the connect.
    for _ in 0..2 {
        let store = open_postgres(&url).await;
        assert_eq!(store.get_run("run_1").await.unwrap(), Some(queued_record("run_1", 1_000)));
        store.close().await.unwrap();
        assert_eq!(schema_version(&client).await, postgres::SCHEMA_VERSION);
    }
}

#[tokio::test]
async fn postgres_refuses_a_database_from_a_newer_build() {
    let Some(url) = postgres_database().await else { return };
    open_postgres(&url).await.close().await.unwrap();
    let client = plain_connection(&url).await;
    client
        .execute("UPDATE lemon_schema SET version = $1", &[&(postgres::SCHEMA_VERSION + 1)])
        .await
        .unwrap();
    match postgres::PostgresStore::connect(postgres_config(&url)).await {
        Err(StoreError::Open { path, message }) => {
            assert!(path.starts_with("postgres://") && !path.contains('@'), "{path}");
            assert!(message.contains("newer"), "{message}");
        }
        other => panic!("expected an open error, got {other:?}"),
    }
}

#[tokio::test]
async fn postgres_a_refused_login_names_neither_the_user_nor_the_password() {
    let Some(server) = postgres::testing::server_url() else { return };
    let config: tokio_postgres::Config = server.parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let url = format!("postgresql://lemon_nobody:hunter2-not-this-one@{host}:{port}/postgres");
    match postgres::PostgresStore::connect(postgres_config(&url)).await {
        Err(error @ StoreError::Open { .. }) => {
            let text = error.to_string();
            assert!(text.contains("refused the login"), "{text}");
            assert!(!text.contains("lemon_nobody"), "{text}");
            assert!(!text.contains("hunter2"), "{text}");
        }
        other => panic!("expected an open error, got {other:?}"),
    }
}

#[tokio::test]
async fn postgres_writes_queued_before_close_are_all_kept() {
    let Some(url) = postgres_database().await else { return };
    let store = open_postgres(&url).await;
    store.insert_run(new_run("run_burst", 1_000)).await;
    for index in 1..=5_000 {
        store
            .append_event(event(
                "run_burst",
                index,
                EventKind::Delta { seq: index, text: format!("word{index} ") },
            ))
            .await;
    }
    store.close().await.unwrap();
    assert_eq!(count_rows(&plain_connection(&url).await, "run_events").await, 5_000);

    let store = open_postgres(&url).await;
    let events = store.run_events("run_burst").await.unwrap();
    assert_eq!(events.len(), 5_000);
    assert!(events.iter().zip(1..).all(|(e, index)| e.index == index));
    store.close().await.unwrap();
}

#[tokio::test]
async fn postgres_dropping_without_close_keeps_queued_writes() {
    let Some(url) = postgres_database().await else { return };
    let store = open_postgres(&url).await;
    store.insert_run(new_run("run_dropped", 1_000)).await;
    for index in 1..=2_000 {
        store
            .append_event(event(
                "run_dropped",
                index,
                EventKind::Delta { seq: index, text: "w ".to_owned() },
            ))
            .await;
    }
    drop(store);
    // The writer task drains its queue on this runtime once the store is gone.
    let client = plain_connection(&url).await;
    crate::testing::within("the dropped store's writes to commit", async {
        while count_rows(&client, "run_events").await < 2_000 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(count_rows(&client, "runs").await, 1);
    assert_eq!(count_rows(&client, "run_events").await, 2_000);
}

#[tokio::test]
async fn postgres_after_close_reads_fail_and_writes_are_dropped() {
    let Some(url) = postgres_database().await else { return };
    let store = open_postgres(&url).await;
    store.insert_run(new_run("run_1", 1_000)).await;
    store.close().await.unwrap();
    // Closing twice is harmless.
    store.close().await.unwrap();

    assert_eq!(store.get_run("run_1").await, Err(StoreError::Closed));
    assert_eq!(
        store.list_runs(RunFilter { status: None, limit: 1 }).await,
        Err(StoreError::Closed)
    );
    assert_eq!(store.run_events("run_1").await, Err(StoreError::Closed));
    assert_eq!(store.get_chat_state(&SessionKey::from("s1"), 1).await, Err(StoreError::Closed));
    assert_eq!(store.kv_get("ns", "k", 1).await, Err(StoreError::Closed));
    assert_eq!(store.flush().await, Err(StoreError::Closed));
    assert_eq!(store.check_writable().await, Err(StoreError::Closed));
    assert_eq!(
        store.retention().prune(PruneStep::Runs { before_ms: i64::MAX, limit: 1 }).await,
        Err(StoreError::Closed)
    );

    store.insert_run(new_run("run_2", 1_000)).await;
    store.mark_running(run_id("run_1"), "echo".to_owned(), 1).await;
    store.append_event(event("run_1", 1, EventKind::Phase(RunPhase::Accepted))).await;
    store.finalize_run(finished("run_1", Completion::success("x", None))).await;
    store.put_chat_state(&SessionKey::from("s1"), "echo", "tok", 1).await;
    store.kv_put("ns", "k", json!(1), None).await;
    drop(store);

    let client = plain_connection(&url).await;
    assert_eq!(count_rows(&client, "runs").await, 1);
    let status: String = client.query_one("SELECT status FROM runs", &[]).await.unwrap().get(0);
    assert_eq!(status, "queued");
    for table in ["run_events", "chat_state", "kv"] {
        assert_eq!(count_rows(&client, table).await, 0, "{table}");
    }
}

/// PostgreSQL text cannot hold a NUL character, which SQLite keeps: outside
/// text that has one is stored with U+FFFD in its place, and found again by
/// the same key, instead of failing the write and losing the run.
#[tokio::test]
async fn postgres_stores_a_nul_in_outside_text_as_a_replacement_character() {
    let Some(url) = postgres_database().await else { return };
    let store = open_postgres(&url).await;
    let run = NewRun {
        prompt: "nul \0 byte".to_owned(),
        session_key: "chat\0key".into(),
        ..new_run("run_nul", 1_000)
    };
    store.insert_run(run).await;
    store.kv_put("ns\0", "key\0", json!({ "text": "in json \0 stays" }), None).await;
    store.flush().await.unwrap();
    let stored = store.get_run("run_nul").await.unwrap().expect("the run is kept");
    assert_eq!(stored.prompt, "nul \u{FFFD} byte");
    assert_eq!(stored.session_key.as_str(), "chat\u{FFFD}key");
    assert_eq!(store.session_runs(&"chat\0key".into(), 10).await.unwrap().len(), 1);
    assert_eq!(
        store.kv_get("ns\0", "key\0", 0).await.unwrap(),
        Some(json!({ "text": "in json \0 stays" }))
    );
    store.close().await.unwrap();
}

/// A write the database refuses for what it holds (here a session key too
/// large for its index's row), which no retry would change.
#[tokio::test]
async fn postgres_a_refused_write_is_dropped_alone_and_reported_until_a_write_succeeds() {
    let Some(url) = postgres_database().await else { return };
    let store = open_postgres(&url).await;
    store.check_writable().await.unwrap();
    store.insert_run(new_run("run_before", 1_000)).await;
    // Random hex does not compress below the b-tree's 2 704-byte row limit.
    let huge: String = (0..400).map(|_| uuid::Uuid::new_v4().simple().to_string()).collect();
    let bad = NewRun { session_key: huge.into(), ..new_run("run_bad", 1_000) };
    store.insert_run(bad).await;
    store.insert_run(new_run("run_after", 1_000)).await;
    store.append_event(event("run_after", 1, EventKind::Phase(RunPhase::Accepted))).await;
    match store.flush().await {
        Err(StoreError::Database(message)) => {
            assert!(message.starts_with("insert_run: "), "{message}");
        }
        other => panic!("expected a database error, got {other:?}"),
    }
    // Reported until a write succeeds; the rest of the batch is kept.
    assert!(matches!(store.flush().await, Err(StoreError::Database(_))));
    assert_eq!(store.get_run("run_bad").await.unwrap(), None);
    assert_eq!(
        store.get_run("run_before").await.unwrap(),
        Some(queued_record("run_before", 1_000))
    );
    assert_eq!(store.get_run("run_after").await.unwrap(), Some(queued_record("run_after", 1_000)));
    assert_eq!(store.run_events("run_after").await.unwrap().len(), 1);
    store.check_writable().await.unwrap();
    store.flush().await.unwrap();
    store.close().await.unwrap();
}

/// Another session ends every connection of the store's database while runs
/// are being written, several times: the writer keeps its batch, reconnects
/// and tries again, so every run and event is there in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_writes_survive_the_server_ending_the_stores_connections() {
    let Some(url) = postgres_database().await else { return };
    let store = open_postgres(&url).await;
    let killer = plain_connection(&url).await;
    const END_OTHERS: &str = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()";
    let writing = tokio::spawn({
        let store = store.clone();
        async move {
            for n in 0..300 {
                let id = format!("run_{n}");
                store.insert_run(new_run(&id, 1_000)).await;
                store.mark_running(run_id(&id), "echo".to_owned(), 1_001).await;
                for index in 1..=3 {
                    let delta = EventKind::Delta { seq: index, text: format!("{id} {index}") };
                    store.append_event(event(&id, index, delta)).await;
                }
                store.finalize_run(finished(&id, Completion::success("ok", None))).await;
                if n % 10 == 9 {
                    // Spreads the traffic over time; failing while connections end is expected.
                    let _ = store.flush().await;
                }
            }
        }
    });
    // A few times, far enough apart for the writer to reconnect and commit
    // in between (ending them faster than a connection is made would starve it).
    let mut n_ended = 0;
    for _ in 0..5 {
        n_ended += killer.execute(END_OTHERS, &[]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(n_ended > 0, "no connection was ended");
    crate::testing::within("the runs to be queued", writing).await.unwrap();

    crate::testing::within("the writes to commit after the connections ended", async {
        while store.flush().await.is_err() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    let completed = store
        .list_runs(RunFilter { status: Some(RunStatus::Completed), limit: 1_000 })
        .await
        .unwrap();
    assert_eq!(completed.len(), 300);
    assert_eq!(count_rows(&killer, "run_events").await, 900);
    assert_eq!(store.run_events("run_299").await.unwrap().len(), 3);
    store.close().await.unwrap();
}

/// While the database takes no connections, barriers say so at once instead
/// of waiting; the writes wait in the writer, and once connections are
/// allowed again they commit and barriers succeed.
#[tokio::test]
async fn postgres_writes_wait_out_a_database_that_takes_no_connections() {
    let Some(server) = postgres::testing::server_url() else { return };
    let url = postgres::testing::fresh_database(&server).await;
    let name = url.parse::<tokio_postgres::Config>().unwrap().get_dbname().unwrap().to_owned();
    let admin = plain_connection(&server).await;
    let store = open_postgres(&url).await;
    store.insert_run(new_run("run_before", 1_000)).await;
    store.flush().await.unwrap();

    admin.batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false")).await.unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap();
    store.insert_run(new_run("run_during", 1_000)).await;
    store.append_event(event("run_during", 1, EventKind::Phase(RunPhase::Accepted))).await;
    assert!(matches!(store.flush().await, Err(StoreError::Database(_))));
    // Answered while the writer waits to try again.
    assert!(matches!(store.check_writable().await, Err(StoreError::Database(_))));

    admin.batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true")).await.unwrap();
    crate::testing::within("the held writes to commit", async {
        while store.flush().await.is_err() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(
        store.get_run("run_during").await.unwrap(),
        Some(queued_record("run_during", 1_000))
    );
    assert_eq!(store.run_events("run_during").await.unwrap().len(), 1);
    store.check_writable().await.unwrap();
    store.close().await.unwrap();
}
