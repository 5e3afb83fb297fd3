use super::*;
use crate::engine::Completion;

fn new_run(id: &str) -> NewRun {
    NewRun {
        run_id: RunId::parse(id).unwrap(),
        session_key: "s".into(),
        conversation: "session:s".into(),
        engine: "echo".into(),
        prompt: "p".into(),
        meta: serde_json::Value::Null,
        resumed_from: None,
        created_at_ms: 1,
    }
}

fn finished(id: &str) -> FinishedRun {
    FinishedRun {
        run_id: RunId::parse(id).unwrap(),
        engine: "echo".into(),
        completion: Completion::success("a", None),
        completed_at_ms: 2,
        duration_ms: 1,
        spend: Default::default(),
    }
}

#[tokio::test]
async fn the_oldest_finished_runs_are_forgotten_past_the_limit() {
    let store = MemoryStore::with_max_runs(1000, 2);
    store.insert_run(new_run("a")).await;
    store.insert_run(new_run("b")).await;
    store.insert_run(new_run("c")).await;
    // "a" is unfinished, so nothing is dropped yet.
    assert!(store.get_run("a").await.unwrap().is_some());
    store.finalize_run(finished("a")).await;
    store.insert_run(new_run("d")).await;
    assert!(store.get_run("a").await.unwrap().is_none(), "finished and oldest: forgotten");
    for id in ["b", "c", "d"] {
        assert!(store.get_run(id).await.unwrap().is_some(), "{id} kept");
    }
}

#[tokio::test]
async fn inserting_a_run_again_keeps_its_place_and_creation_time() {
    let store = MemoryStore::new(1000);
    store.insert_run(new_run("a")).await;
    store.insert_run(new_run("b")).await;
    store.insert_run(NewRun { created_at_ms: 99, engine: "claude".into(), ..new_run("a") }).await;
    let runs = store.list_runs(RunFilter { status: None, limit: 10 }).await.unwrap();
    let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["b", "a"], "listed once, in its first place");
    let a = store.get_run("a").await.unwrap().unwrap();
    assert_eq!((a.created_at_ms, a.engine.as_str()), (1, "claude"));
}
