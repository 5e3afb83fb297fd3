//! Random interleavings of submits in every queue mode, cancels, aborts and
//! engine completions, in paused time. Whatever happens: each accepted request
//! completes exactly once, a conversation runs one request at a time, collected
//! requests start in submission order, and no steer is lost or delivered twice.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Submit { session: u8, mode: u8, behaviour: u8, delay: u16 },
    CancelSession { session: u8 },
    AbortSession { session: u8 },
    AbortRun { pick: u16 },
    Advance { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..3, 0u8..6, 0u8..5, 0u16..300).prop_map(|(session, mode, behaviour, delay)| Op::Submit { session, mode, behaviour, delay }),
        1 => (0u8..3).prop_map(|session| Op::CancelSession { session }),
        1 => (0u8..3).prop_map(|session| Op::AbortSession { session }),
        2 => any::<u16>().prop_map(|pick| Op::AbortRun { pick }),
        3 => (0u16..400).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn prompt(behaviour: u8, delay: u16, n: usize) -> String {
    match behaviour {
        0 | 1 => format!("sleep:{delay} p{n}"),
        2 => format!("ok p{n}"),
        3 => format!("fail p{n}"),
        _ => format!("hang p{n}"),
    }
}

/// The prompt lines each start carried (merged followups start as one prompt).
fn started_lines(h: &Harness) -> Vec<String> {
    h.fake.started().iter().flat_map(|p| p.lines().map(str::to_owned).collect::<Vec<_>>()).collect()
}

struct Submitted {
    run_id: RunId,
    session: String,
    prompt: String,
    mode: QueueMode,
}

async fn scenario(ops: Vec<Op>, cap: Option<usize>) {
    let config = RouterConfig {
        limits: Limits { cap, drop: crate::config::DropPolicy::Oldest },
        ..router_config()
    };
    let mut h = harness(config).await;
    let mut accepted: Vec<Submitted> = Vec::new();
    for op in ops {
        match op {
            Op::Submit { session, mode, behaviour, delay } => {
                let session = format!("s{session}");
                let mode = QueueMode::ALL[mode as usize % QueueMode::ALL.len()];
                // Steers carry plain text: it is either taken by the live run or runs.
                let prompt = if matches!(
                    mode,
                    QueueMode::Steer | QueueMode::SteerBacklog | QueueMode::Redirect
                ) {
                    format!("ok p{}", accepted.len())
                } else {
                    prompt(behaviour, delay, accepted.len())
                };
                let run_id = h.submit(&session, &prompt, Some(mode)).await;
                accepted.push(Submitted { run_id, session, prompt, mode });
            }
            Op::CancelSession { session } => {
                h.router.cancel_session(&SessionKey::from(format!("s{session}"))).await.unwrap();
            }
            Op::AbortSession { session } => {
                h.router.abort_session(&SessionKey::from(format!("s{session}"))).await.unwrap();
            }
            Op::AbortRun { pick } if !accepted.is_empty() => {
                let run_id = &accepted[pick as usize % accepted.len()].run_id;
                h.router.abort_run(run_id).await.unwrap();
            }
            Op::AbortRun { .. } => {}
            Op::Advance { ms } => tokio::time::sleep(Duration::from_millis(u64::from(ms))).await,
        }
    }
    // Hanging runs end only when cancelled; stop every session's current work
    // repeatedly until every accepted request has completed.
    let mut completions: HashMap<RunId, Completion> = HashMap::new();
    while completions.len() < accepted.len() {
        for session in 0..3 {
            h.router.cancel_session(&SessionKey::from(format!("s{session}"))).await.unwrap();
        }
        let wait = tokio::time::timeout(Duration::from_secs(5), h.completions(1)).await;
        for (run_id, completion) in wait.into_iter().flatten() {
            assert!(
                completions.insert(run_id.clone(), completion).is_none(),
                "{run_id} completed twice"
            );
        }
    }
    for submitted in &accepted {
        assert!(
            completions.contains_key(&submitted.run_id),
            "{} never completed",
            submitted.prompt
        );
    }
    assert_eq!(completions.len(), accepted.len(), "no completions of unknown runs");
    assert!(h.fake.max_per_session() <= 1, "one run per conversation at a time");

    // Collected requests of a session start in the order they were submitted.
    let lines = started_lines(&h);
    let position: HashMap<&str, usize> =
        lines.iter().enumerate().map(|(i, p)| (p.as_str(), i)).collect();
    let mut last: HashMap<&str, usize> = HashMap::new();
    for s in accepted.iter().filter(|s| s.mode == QueueMode::Collect) {
        if let Some(&at) = position.get(s.prompt.as_str()) {
            if let Some(&before) = last.get(s.session.as_str()) {
                assert!(before < at, "{}: {} started out of order", s.session, s.prompt);
            }
            last.insert(&s.session, at);
        }
    }
    // A steer is delivered at most once, as a steer or as a run, and a steer that
    // completed successfully was delivered.
    let steered = h.fake.steered();
    for s in accepted.iter().filter(|s| {
        matches!(s.mode, QueueMode::Steer | QueueMode::SteerBacklog | QueueMode::Redirect)
    }) {
        let times = steered.iter().filter(|t| **t == s.prompt).count()
            + lines.iter().filter(|l| **l == s.prompt).count();
        assert!(times <= 1, "{} delivered {times} times", s.prompt);
        if completions[&s.run_id].ok {
            assert_eq!(times, 1, "{} completed ok but was never delivered", s.prompt);
        }
    }
    // Nothing is left behind, so no completion can still come.
    for session in 0..3 {
        loop {
            let view = h.router.session(&SessionKey::from(format!("s{session}"))).await.unwrap();
            if view.active.is_empty() && view.queued.is_empty() && view.pending_steers == 0 {
                break;
            }
            // The router is still handling an end it was told about; let it run.
            tokio::task::yield_now().await;
        }
    }
    let snapshot = h.router.query().snapshot().await.unwrap();
    assert_eq!((snapshot.in_flight, snapshot.queued), (0, 0));
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
    fn every_accepted_request_completes_once_in_order_and_steers_are_never_lost(
        ops in proptest::collection::vec(op(), 1..40),
        cap in proptest::option::of(1usize..4),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        runtime.block_on(scenario(ops, cap));
    }
}
