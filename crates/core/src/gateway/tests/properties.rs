//! Random submit / cancel / engine-crash sequences under paused time: every
//! accepted request completes exactly once, the global limit and per-conversation
//! exclusivity hold, and each conversation starts its requests in submission order.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Submit { session: u8, behaviour: u8, delay: u16 },
    Cancel { pick: u16 },
    Yield,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..4, 0u8..6, 0u16..200).prop_map(|(session, behaviour, delay)| Op::Submit { session, behaviour, delay }),
        2 => any::<u16>().prop_map(|pick| Op::Cancel { pick }),
        1 => Just(Op::Yield),
    ]
}

fn prompt(behaviour: u8, delay: u16, n: usize) -> String {
    match behaviour {
        0 => format!("sleep:{delay} p{n}"),
        1 => format!("ok p{n}"),
        2 => format!("crash p{n}"),
        3 => format!("fail p{n}"),
        4 => format!("hang p{n}"),
        _ => format!("taskpanic p{n}"),
    }
}

async fn scenario(max: usize, ops: Vec<Op>) {
    let config = RuntimeConfig { run_inactivity_timeout: Duration::from_secs(2), ..config(max) };
    let mut h = harness(config);
    let mut accepted: Vec<(RunId, String, String)> = Vec::new();
    for op in ops {
        match op {
            Op::Submit { session, behaviour, delay } => {
                let session = format!("s{session}");
                let prompt = prompt(behaviour, delay, accepted.len());
                let run_id = h.gateway.submit(request(&session, &prompt)).await.unwrap();
                accepted.push((run_id, session, prompt));
            }
            Op::Cancel { pick } if !accepted.is_empty() => {
                let (run_id, _, _) = &accepted[pick as usize % accepted.len()];
                h.gateway.cancel(run_id, RunError::UserRequested).await.unwrap();
            }
            Op::Cancel { .. } => {}
            Op::Yield => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let events = collect(&mut h.events, accepted.len()).await;
    assert_eq!(events.len(), accepted.len(), "no events of unknown runs");
    for (run_id, _, prompt) in &accepted {
        let done = completion(&events[run_id]);
        if prompt.starts_with("hang") {
            assert!(!done.ok, "{prompt}");
        }
    }
    assert!(h.fake.max_running() <= max, "{} runs at once with max {max}", h.fake.max_running());
    assert!(h.fake.max_per_session() <= 1);

    // Within a session, runs start in submission order.
    let started = h.fake.started();
    let position: HashMap<&str, usize> =
        started.iter().enumerate().map(|(i, p)| (p.as_str(), i)).collect();
    let mut last_by_session: HashMap<&str, usize> = HashMap::new();
    for (_, session, prompt) in &accepted {
        if let Some(&at) = position.get(prompt.as_str()) {
            if let Some(&before) = last_by_session.get(session.as_str()) {
                assert!(before < at, "{session}: {prompt} started out of order");
            }
            last_by_session.insert(session, at);
        }
    }
    // Nothing is left behind.
    let snapshot = h.gateway.snapshot().await.unwrap();
    assert_eq!(
        (snapshot.in_flight, snapshot.queued, snapshot.conversations, snapshot.waitq),
        (0, 0, 0, 0)
    );
    // No completion arrives twice: the subscription holds nothing more for these runs.
    h.token.cancel();
    h.tracker.close();
    h.tracker.wait().await;
    while let Ok(Some(event)) = h.events.try_recv() {
        assert!(
            !matches!(event.kind, EventKind::RunCompleted { .. }),
            "a second completion for {}",
            event.run_id
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_accepted_request_completes_exactly_once(max in 1usize..4, ops in proptest::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        runtime.block_on(scenario(max, ops));
    }
}
