//! Random interleavings of submits in every queue mode (some resuming an
//! earlier run's session, so two conversations contend for its engine lock),
//! cancels, aborts, engine completions, failures, hangs and crashes, live
//! resizes of the slot count, and restarts (after a drain or at once) on the
//! same store, in paused time, under both drop policies. Whatever happens:
//! each accepted request completes exactly once, a conversation runs one
//! request at a time, collected requests start in submission order, and no
//! steer is lost or delivered twice. Every wait is bounded, so a lost request
//! fails the test instead of hanging it.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

/// Sessions the operations pick from.
const SESSIONS: u8 = 6;
/// Rounds of "cancel everything, wait for completions" before a request that
/// never completes fails the test.
const DRAIN_ROUNDS: usize = 20;

#[derive(Debug, Clone)]
enum Op {
    /// `token`: explicitly resume the session an earlier run reported, in a
    /// session of its own, so two conversations contend for one engine lock.
    Submit {
        session: u8,
        mode: u8,
        behaviour: u8,
        delay: u16,
        token: Option<u16>,
    },
    CancelSession {
        session: u8,
    },
    AbortSession {
        session: u8,
    },
    AbortRun {
        pick: u16,
    },
    /// `max_concurrent_runs` changed live.
    Resize {
        max: u8,
    },
    Advance {
        ms: u16,
    },
    /// The gateway stops (after a drain, or at once) and starts again on the
    /// same store, recovering its journal.
    Restart {
        drain: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..SESSIONS, 0u8..6, 0u8..6, 0u16..300, proptest::option::weighted(0.2, any::<u16>()))
            .prop_map(|(session, mode, behaviour, delay, token)| Op::Submit { session, mode, behaviour, delay, token }),
        1 => (0u8..SESSIONS).prop_map(|session| Op::CancelSession { session }),
        1 => (0u8..SESSIONS).prop_map(|session| Op::AbortSession { session }),
        2 => any::<u16>().prop_map(|pick| Op::AbortRun { pick }),
        1 => (1u8..5).prop_map(|max| Op::Resize { max }),
        3 => (0u16..400).prop_map(|ms| Op::Advance { ms }),
        1 => any::<bool>().prop_map(|drain| Op::Restart { drain }),
    ]
}

fn prompt(behaviour: u8, delay: u16, n: usize) -> String {
    match behaviour {
        0 | 1 => format!("sleep:{delay} p{n}"),
        2 => format!("ok p{n}"),
        3 => format!("fail p{n}"),
        4 => format!("hang p{n}"),
        _ => format!("crash p{n}"),
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

/// Takes the completions the harness's bus already published.
fn take_completions(h: &mut Harness, completions: &mut HashMap<RunId, Completion>) {
    while let Ok(Some(event)) = h.events.try_recv() {
        if let EventKind::RunCompleted { completion, .. } = &event.kind {
            let first = completions.insert(event.run_id.clone(), completion.clone());
            assert!(first.is_none(), "{} completed twice", event.run_id);
        }
    }
}

async fn scenario(ops: Vec<Op>, cap: Option<usize>, drop: crate::config::DropPolicy) {
    let config = RouterConfig { limits: Limits { cap, drop: Some(drop) }, ..router_config() };
    let mut h = harness(config.clone()).await;
    let mut accepted: Vec<Submitted> = Vec::new();
    let mut completions: HashMap<RunId, Completion> = HashMap::new();
    let mut max = 4;
    for op in ops {
        match op {
            Op::Submit { session, mode, behaviour, delay, token } => {
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
                // The fake reports `<run id>-session`; resuming an earlier run's
                // session contends with the session that continues it.
                let resume = token.filter(|_| !accepted.is_empty()).map(|pick| {
                    let earlier = &accepted[pick as usize % accepted.len()].run_id;
                    ResumeToken::new("fake", format!("{earlier}-session"))
                });
                let session = match &resume {
                    Some(_) => format!("r{}", accepted.len()),
                    None => format!("s{session}"),
                };
                let req = RunRequest { resume, ..request(&session, &prompt, Some(mode)) };
                let run_id = h.submit_req(req).await;
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
            Op::Resize { max: to } => {
                max = usize::from(to);
                h.gateway.set_max_concurrent_runs(max).await.unwrap();
            }
            Op::Advance { ms } => tokio::time::sleep(Duration::from_millis(u64::from(ms))).await,
            Op::Restart { drain } => {
                if drain {
                    let grace = Duration::from_millis(100);
                    crate::testing::within("the drain", h.gateway.drain(grace)).await.unwrap();
                }
                h.stop().await;
                take_completions(&mut h, &mut completions);
                let (fake, store) = (h.fake.clone(), h.store.clone());
                h = harness_with(config.clone(), fake, store).await;
                h.gateway.set_max_concurrent_runs(max).await.unwrap();
            }
        }
    }
    // Hanging runs end only when cancelled; stop every session's current work
    // until every accepted request has completed, for a bounded number of rounds.
    let sessions: Vec<SessionKey> = {
        let mut keys: Vec<String> = accepted.iter().map(|s| s.session.clone()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter().map(SessionKey::from).collect()
    };
    for _ in 0..DRAIN_ROUNDS {
        take_completions(&mut h, &mut completions);
        if accepted.iter().all(|s| completions.contains_key(&s.run_id)) {
            break;
        }
        for session in &sessions {
            h.router.cancel_session(session).await.unwrap();
        }
        let wait = tokio::time::timeout(Duration::from_secs(5), h.completions(1)).await;
        for (run_id, completion) in wait.into_iter().flatten() {
            assert!(
                completions.insert(run_id.clone(), completion).is_none(),
                "{run_id} completed twice"
            );
        }
    }
    take_completions(&mut h, &mut completions);
    let lost: Vec<&str> = accepted
        .iter()
        .filter(|s| !completions.contains_key(&s.run_id))
        .map(|s| s.prompt.as_str())
        .collect();
    assert!(lost.is_empty(), "never completed after {DRAIN_ROUNDS} rounds: {lost:?}");
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
    for session in &sessions {
        crate::testing::poll_until("the router to let go of every session", || async {
            let view = h.router.session(session).await.unwrap();
            view.active.is_empty() && view.queued.is_empty() && view.pending_steers == 0
        })
        .await;
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
        newest in any::<bool>(),
    ) {
        let drop = if newest { crate::config::DropPolicy::Newest } else { crate::config::DropPolicy::Oldest };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        runtime.block_on(scenario(ops, cap, drop));
    }
}
