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
