//! Tests of the registry and its supervisors with scripted fake transports under
//! paused time, of the enable rule and of transport ids.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bus::EventBus;
use crate::engine::EngineRegistry;
use crate::gateway::{GatewayDeps, GatewayHandle, RuntimeConfig};
use crate::router::{RouterConfig, RouterHandle};
use crate::store::StoreHandle;
use async_trait::async_trait;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::*;

/// Far longer than any wait below; under paused time it only fires on a hang.
const PATIENCE: Duration = Duration::from_secs(24 * 60 * 60);

async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    crate::testing::within_for(PATIENCE, what, fut).await
}

/// What one `run` of a fake transport does.
#[derive(Debug, Clone)]
enum Step {
    /// Fails at once with a retryable error.
    Fail(&'static str),
    /// Fails at once with a fatal error.
    Fatal(&'static str),
    Panic(&'static str),
    /// Returns `Ok` at once, without a shutdown.
    Return,
    /// Reports running, then fails after this long.
    RunThenFail(Duration),
    /// Reports running until shutdown.
    Serve,
}

/// A transport that follows a script, one step per start (the last step
/// repeats), and records when it was started.
#[derive(Debug)]
struct FakeTransport {
    id: &'static str,
    script: Mutex<VecDeque<Step>>,
    starts: Arc<Mutex<Vec<Instant>>>,
}

impl FakeTransport {
    fn new(id: &'static str, script: &[Step]) -> (Arc<Self>, Arc<Mutex<Vec<Instant>>>) {
        let starts = Arc::new(Mutex::new(Vec::new()));
        let transport = FakeTransport {
            id,
            script: Mutex::new(script.iter().cloned().collect()),
            starts: starts.clone(),
        };
        (Arc::new(transport), starts)
    }

    fn next_step(&self) -> Step {
        let mut script = self.script.lock().unwrap();
        if script.len() > 1 {
            script.pop_front().unwrap()
        } else {
            script.front().cloned().unwrap_or(Step::Serve)
        }
    }
}

#[async_trait]
impl Transport for FakeTransport {
    fn id(&self) -> &str {
        self.id
    }

    async fn run(&self, ctx: TransportContext) -> Result<(), TransportError> {
        self.starts.lock().unwrap().push(Instant::now());
        match self.next_step() {
            Step::Fail(reason) => Err(TransportError::retryable(reason)),
            Step::Fatal(reason) => Err(TransportError::fatal(reason)),
            Step::Panic(message) => panic!("{message}"),
            Step::Return => Ok(()),
            Step::RunThenFail(after) => {
                ctx.status.running(Some(format!("{} serving", self.id)));
                tokio::select! {
                    () = ctx.shutdown.cancelled() => Ok(()),
                    () = tokio::time::sleep(after) => Err(TransportError::retryable("lost the connection")),
                }
            }
            Step::Serve => {
                ctx.status.running(Some(format!("{} serving", self.id)));
                ctx.shutdown.cancelled().await;
                Ok(())
            }
        }
    }
}

/// A gateway and router to hand transports, and the registry's inputs.
struct Harness {
    deps: TransportDeps,
    _gateway: GatewayHandle,
}

impl Harness {
    fn new() -> Self {
        let tracker = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let store = StoreHandle::memory();
        let deps = GatewayDeps {
            config: RuntimeConfig::default(),
            engines: EngineRegistry::new(),
            store: store.clone(),
            bus: EventBus::default(),
        };
        let gateway = GatewayHandle::start(deps, shutdown.clone(), &tracker);
        let router = RouterHandle::start(
            RouterConfig::default(),
            gateway.clone(),
            shutdown.clone(),
            &tracker,
        );
        Harness {
            deps: TransportDeps {
                router,
                store,
                shutdown,
                tracker,
                http: super::listener::ServeConfig::default(),
                approvals: crate::approvals::ApprovalHub::default(),
                media: crate::media::MediaStage::new(std::env::temp_dir().join("lemon-media-test")),
            },
            _gateway: gateway,
        }
    }

    fn start(&self, transports: Vec<Arc<dyn Transport>>) -> TransportStatuses {
        let mut registry = TransportRegistry::default();
        for transport in transports {
            registry.add(transport).unwrap();
        }
        registry.start(&self.deps)
    }

    async fn shut_down(&self) {
        self.deps.shutdown.cancel();
        self.deps.tracker.close();
        within("every task to end", self.deps.tracker.wait()).await;
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.deps.shutdown.cancel();
    }
}

/// Waits until `id` is in a state `wanted` accepts, and returns it.
async fn state_of(
    statuses: &TransportStatuses,
    id: &str,
    wanted: impl Fn(&TransportState) -> bool,
) -> TransportState {
    let map = within(
        &format!("a state of {id}"),
        statuses.wait_for(|map| map.get(id).is_some_and(&wanted)),
    )
    .await;
    map[id].clone()
}

fn running(state: &TransportState) -> bool {
    matches!(state, TransportState::Running { .. })
}

fn failing(state: &TransportState) -> bool {
    state.is_failing()
}

fn failing_attempt(n: u32) -> impl Fn(&TransportState) -> bool {
    move |state| matches!(state, TransportState::Failing { attempts, .. } if *attempts == n)
}

fn gaps(starts: &Mutex<Vec<Instant>>) -> Vec<Duration> {
    let starts = starts.lock().unwrap();
    starts.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn a_transport_that_fails_twice_is_restarted_with_backoff_and_then_runs() {
    let h = Harness::new();
    let (fake, starts) = FakeTransport::new(
        "fake",
        &[Step::Fail("port in use"), Step::Fail("port in use"), Step::Serve],
    );
    let statuses = h.start(vec![fake]);
    assert_eq!(
        state_of(&statuses, "fake", failing_attempt(1)).await,
        TransportState::Failing {
            reason: "port in use".into(),
            attempts: 1,
            retry_in_ms: Some(1_000)
        }
    );
    assert_eq!(
        state_of(&statuses, "fake", failing_attempt(2)).await,
        TransportState::Failing {
            reason: "port in use".into(),
            attempts: 2,
            retry_in_ms: Some(2_000)
        }
    );
    assert_eq!(
        state_of(&statuses, "fake", running).await,
        TransportState::Running { detail: Some("fake serving".into()) }
    );
    assert_eq!(gaps(&starts), [Duration::from_secs(1), Duration::from_secs(2)]);
    assert_eq!(
        statuses.to_json(),
        json!({ "fake": { "state": "running", "detail": "fake serving" } })
    );
    h.shut_down().await;
    assert_eq!(statuses.get("fake"), Some(TransportState::Stopped));
    assert_eq!(starts.lock().unwrap().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_error_is_not_retried() {
    let h = Harness::new();
    let (fake, starts) = FakeTransport::new("fake", &[Step::Fatal("bad token"), Step::Serve]);
    let statuses = h.start(vec![fake]);
    let state = state_of(&statuses, "fake", failing).await;
    assert_eq!(
        state,
        TransportState::Failing { reason: "bad token".into(), attempts: 1, retry_in_ms: None }
    );
    assert_eq!(
        state.to_json(),
        json!({ "state": "failing", "reason": "bad token", "attempts": 1, "retry_in_ms": null })
    );
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(starts.lock().unwrap().len(), 1, "never started again");
    assert_eq!(statuses.get("fake"), Some(state));
    h.shut_down().await;
    assert_eq!(statuses.get("fake"), Some(TransportState::Stopped));
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_run_is_a_retryable_failure() {
    let h = Harness::new();
    let (fake, starts) = FakeTransport::new("fake", &[Step::Panic("boom"), Step::Serve]);
    let statuses = h.start(vec![fake]);
    assert_eq!(
        state_of(&statuses, "fake", failing).await,
        TransportState::Failing {
            reason: "panicked: boom".into(),
            attempts: 1,
            retry_in_ms: Some(1_000)
        }
    );
    state_of(&statuses, "fake", running).await;
    assert_eq!(starts.lock().unwrap().len(), 2);
    h.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn returning_without_a_shutdown_counts_as_a_failure() {
    let h = Harness::new();
    let (fake, _) = FakeTransport::new("fake", &[Step::Return, Step::Serve]);
    let statuses = h.start(vec![fake]);
    let state = state_of(&statuses, "fake", failing).await;
    assert!(
        matches!(&state, TransportState::Failing { reason, retry_in_ms: Some(1_000), .. } if reason == "stopped without an error"),
        "{state:?}"
    );
    state_of(&statuses, "fake", running).await;
    h.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn the_backoff_doubles_up_to_five_minutes() {
    let h = Harness::new();
    let (fake, starts) = FakeTransport::new("fake", &[Step::Fail("down")]);
    let statuses = h.start(vec![fake]);
    let mut waits = Vec::new();
    for attempt in 1..=11 {
        match state_of(&statuses, "fake", failing_attempt(attempt)).await {
            TransportState::Failing { retry_in_ms: Some(ms), .. } => waits.push(ms / 1000),
            other => panic!("attempt {attempt}: {other:?}"),
        }
    }
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    let expected: Vec<Duration> = waits[..10].iter().map(|s| Duration::from_secs(*s)).collect();
    assert_eq!(gaps(&starts), expected, "started again exactly when announced");
    h.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn the_backoff_starts_over_once_the_transport_has_run_a_while() {
    let h = Harness::new();
    let script = [
        Step::Fail("down"),
        Step::Fail("down"),
        Step::RunThenFail(Duration::from_secs(120)),
        Step::RunThenFail(Duration::from_secs(5)),
        Step::Serve,
    ];
    let (fake, _) = FakeTransport::new("fake", &script);
    let statuses = h.start(vec![fake]);
    state_of(&statuses, "fake", failing_attempt(2)).await;
    // It ran two minutes before failing: a first failure again.
    let state = state_of(
        &statuses,
        "fake",
        |s| matches!(s, TransportState::Failing { reason, .. } if reason == "lost the connection"),
    )
    .await;
    assert_eq!(
        state,
        TransportState::Failing {
            reason: "lost the connection".into(),
            attempts: 1,
            retry_in_ms: Some(1_000)
        }
    );
    // A short run does not count as recovered: the next failure backs off further.
    assert_eq!(
        state_of(&statuses, "fake", failing_attempt(2)).await,
        TransportState::Failing {
            reason: "lost the connection".into(),
            attempts: 2,
            retry_in_ms: Some(2_000)
        }
    );
    state_of(&statuses, "fake", running).await;
    h.shut_down().await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_the_backoff_stops_at_once() {
    let h = Harness::new();
    let (fake, starts) = FakeTransport::new("fake", &[Step::Fail("down")]);
    let statuses = h.start(vec![fake]);
    state_of(&statuses, "fake", failing).await;
    let before = Instant::now();
    h.shut_down().await;
    assert_eq!(Instant::now(), before, "no backoff was waited out");
    assert_eq!(statuses.get("fake"), Some(TransportState::Stopped));
    assert_eq!(starts.lock().unwrap().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn one_failing_transport_leaves_the_others_running() {
    let h = Harness::new();
    let (bad, _) = FakeTransport::new("bad", &[Step::Panic("kaput"), Step::Fail("still down")]);
    let (good, good_starts) = FakeTransport::new("good", &[Step::Serve]);
    let statuses = h.start(vec![bad, good]);
    state_of(&statuses, "bad", failing_attempt(3)).await;
    assert_eq!(
        statuses.get("good"),
        Some(TransportState::Running { detail: Some("good serving".into()) })
    );
    assert_eq!(good_starts.lock().unwrap().len(), 1, "never restarted");
    h.shut_down().await;
    let states: Vec<_> = statuses.snapshot().into_values().collect();
    assert_eq!(states, [TransportState::Stopped, TransportState::Stopped]);
}

#[tokio::test(start_paused = true)]
async fn disabled_transports_are_listed_and_never_started() {
    let h = Harness::new();
    let (on, _) = FakeTransport::new("on", &[Step::Serve]);
    let mut registry = TransportRegistry::default();
    registry.add_disabled("telegram").unwrap();
    registry.add(on).unwrap();
    assert_eq!(registry.ids(), ["telegram", "on"]);
    assert_eq!(registry.enabled_ids(), ["on"]);
    let statuses = registry.start(&h.deps);
    assert_eq!(statuses.get("telegram"), Some(TransportState::Disabled));
    state_of(&statuses, "on", running).await;
    assert_eq!(
        statuses.to_json(),
        json!({
            "on": { "state": "running", "detail": "on serving" },
            "telegram": { "state": "disabled" },
        })
    );
    h.shut_down().await;
    assert_eq!(statuses.get("telegram"), Some(TransportState::Disabled));
}

#[test]
fn transport_ids_are_checked() {
    for good in ["webhook", "telegram", "my-transport", "my_transport", "sms2", "a", "x1-y_2"] {
        assert_eq!(validate_id(good), Ok(()), "{good}");
    }
    for bad in
        ["", "Invalid-ID", "123transport", "my transport", "trans@port!", "-x", "_x", "wébhook"]
    {
        assert_eq!(validate_id(bad), Err(TransportIdError::Invalid(bad.to_owned())), "{bad:?}");
    }
    for reserved in ["default", "all"] {
        assert_eq!(validate_id(reserved), Err(TransportIdError::Reserved(reserved.to_owned())));
    }
    let mut registry = TransportRegistry::default();
    registry.add_disabled("webhook").unwrap();
    assert_eq!(
        registry.add_disabled("webhook"),
        Err(TransportIdError::Duplicate("webhook".to_owned()))
    );
    let (bad, _) = FakeTransport::new("All", &[Step::Serve]);
    let err = registry.add(bad).unwrap_err();
    assert!(err.to_string().contains("\"All\""), "{err}");
    assert_eq!(registry.ids(), ["webhook"]);
}

#[test]
fn a_transport_is_enabled_by_its_flag_or_its_section_and_the_section_wins() {
    let section = |text: &str| -> toml::Table { toml::from_str(text).unwrap() };
    let on = section("enabled = true\nport = 1");
    let off = section("enabled = false");
    let silent = section("port = 4046");
    let not_a_bool = section("enabled = \"yes\"");
    let cases: [(Option<bool>, Option<&toml::Table>, bool); 12] = [
        (None, None, false),
        (Some(true), None, true),
        (Some(false), None, false),
        (None, Some(&on), true),
        (None, Some(&off), false),
        (Some(false), Some(&on), true),
        (Some(true), Some(&off), false),
        (Some(true), Some(&on), true),
        // A section alone does not switch a transport on.
        (None, Some(&silent), false),
        (Some(true), Some(&silent), true),
        // A non-boolean `enabled` is the transport's parser's to report; here it is unset.
        (None, Some(&not_a_bool), false),
        (Some(true), Some(&not_a_bool), true),
    ];
    for (flag, table, expected) in cases {
        assert_eq!(enabled(flag, table), expected, "flag {flag:?}, section {table:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn statuses_wake_waiters_on_every_change() {
    let statuses = TransportStatuses::default();
    let waiter = {
        let statuses = statuses.clone();
        tokio::spawn(async move {
            statuses.wait_for(|map| map.get("a").is_some_and(TransportState::is_failing)).await
        })
    };
    statuses.set("a", TransportState::Starting);
    statuses.handle("a").set(TransportState::Failing {
        reason: "x".into(),
        attempts: 1,
        retry_in_ms: Some(5),
    });
    let map: BTreeMap<_, _> = within("the waiter", waiter).await.unwrap();
    assert!(map["a"].is_failing());
    // Already true: returns at once.
    let map = statuses.wait_for(|map| map.contains_key("a")).await;
    assert_eq!(map.len(), 1);
}

#[test]
fn an_outboxs_calls_are_in_its_transports_figures() {
    let statuses = TransportStatuses::default();
    let backlog = Backlog::default();
    statuses.track_backlog("discord", backlog.clone());
    backlog.set(2);
    for outcome in [
        CallOutcome::Sent,
        CallOutcome::Sent,
        CallOutcome::Retried,
        CallOutcome::RateLimited,
        CallOutcome::Failed,
    ] {
        backlog.count(outcome);
    }
    let figures = statuses.figures()["discord"];
    assert_eq!(figures.backlog, Some(2));
    let calls = OutboxCalls { n_sent: 2, n_retried: 1, n_rate_limited: 1, n_failed: 1 };
    assert_eq!(figures.outbox_calls, Some(calls));
    // A transport without an outbox has no calls to show.
    statuses.set(
        "webhook",
        TransportState::Failing { reason: "x".into(), attempts: 1, retry_in_ms: None },
    );
    assert_eq!(statuses.figures()["webhook"].outbox_calls, None);
}
