//! Tests of the run collector against a real bus and of the text writer.

use std::sync::Arc;

use lemon_core::bus::{BusEvent, EventBus, EventKind};
use lemon_core::engine::{Completion, RunError};
use lemon_core::ids::{RunId, SessionKey};
use lemon_core::testing::within;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::text::{escape_label_value, Exposition, Kind};
use super::RunMetrics;

struct Collecting {
    bus: EventBus,
    metrics: RunMetrics,
    token: CancellationToken,
    tracker: TaskTracker,
    /// Publishes a marker run completion and waits for it, so every event
    /// published before has been folded.
    n_markers: u64,
}

impl Collecting {
    fn start() -> Self {
        let bus = EventBus::default();
        let (token, tracker) = (CancellationToken::new(), TaskTracker::new());
        let metrics = RunMetrics::spawn(bus.subscribe_all(), None, token.clone(), &tracker);
        Collecting { bus, metrics, token, tracker, n_markers: 0 }
    }

    fn publish(&self, run: &str, ts_ms: i64, kind: EventKind) {
        self.bus.publish(Arc::new(BusEvent {
            run_id: RunId::parse(run).unwrap(),
            session_key: SessionKey::parse("metrics-test").unwrap(),
            index: 1,
            ts_ms,
            kind,
        }));
    }

    /// The scrape text once everything published so far is folded in.
    async fn text(&mut self) -> String {
        self.n_markers += 1;
        let done = Completion::success("", None);
        self.publish(
            "marker",
            0,
            EventKind::RunCompleted { completion: done, engine: "marker".into(), duration_ms: 0 },
        );
        let expected = format!(
            "lemon_runs_completed_total{{engine=\"marker\",outcome=\"completed\"}} {}",
            self.n_markers
        );
        let metrics = self.metrics.clone();
        within("the collector to fold the marker", async move {
            loop {
                let text = render(&metrics);
                if text.lines().any(|line| line == expected) {
                    return text;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
    }

    async fn stop(self) {
        self.token.cancel();
        self.tracker.close();
        within("the collector to stop", self.tracker.wait()).await;
    }
}

fn render(metrics: &RunMetrics) -> String {
    let mut out = Exposition::default();
    metrics.render(&mut out);
    out.finish()
}

fn started(engine: &str) -> EventKind {
    EventKind::RunStarted { engine: engine.into(), model: None }
}

fn completed(engine: &str, completion: Completion, duration_ms: u64) -> EventKind {
    EventKind::RunCompleted { completion, engine: engine.into(), duration_ms }
}

fn has(text: &str, line: &str) {
    assert!(text.lines().any(|l| l == line), "{line:?} missing from:\n{text}");
}

#[tokio::test]
async fn runs_are_counted_by_engine_and_outcome_with_their_durations() {
    let mut c = Collecting::start();
    c.publish("r1", 1_000, started("echo"));
    c.publish("r1", 1_300, EventKind::Delta { seq: 1, text: "he".into() });
    c.publish("r1", 1_900, EventKind::Delta { seq: 2, text: "llo".into() });
    c.publish("r1", 2_000, completed("echo", Completion::success("hello", None), 1_000));
    c.publish("r2", 5_000, started("claude"));
    let failed = Completion::failure(RunError::EngineCrashed { detail: "boom".into() }, None);
    c.publish("r2", 9_000, completed("claude", failed, 40_000));
    c.publish("r3", 5_000, started("claude"));
    c.publish(
        "r3",
        5_100,
        completed("claude", Completion::failure(RunError::UserRequested, None), 100),
    );
    let text = c.text().await;

    has(&text, "# TYPE lemon_runs_started_total counter");
    has(&text, "lemon_runs_started_total{engine=\"echo\"} 1");
    has(&text, "lemon_runs_started_total{engine=\"claude\"} 2");
    has(&text, "lemon_runs_completed_total{engine=\"echo\",outcome=\"completed\"} 1");
    has(&text, "lemon_runs_completed_total{engine=\"echo\",outcome=\"failed\"} 0");
    has(&text, "lemon_runs_completed_total{engine=\"claude\",outcome=\"failed\"} 1");
    has(&text, "lemon_runs_completed_total{engine=\"claude\",outcome=\"cancelled\"} 1");

    // Durations: echo's 1 s falls in le=1; claude's 40 s and 0.1 s.
    has(&text, "# TYPE lemon_run_duration_seconds histogram");
    has(&text, "lemon_run_duration_seconds_bucket{engine=\"echo\",le=\"0.5\"} 0");
    has(&text, "lemon_run_duration_seconds_bucket{engine=\"echo\",le=\"1\"} 1");
    has(&text, "lemon_run_duration_seconds_bucket{engine=\"echo\",le=\"+Inf\"} 1");
    has(&text, "lemon_run_duration_seconds_sum{engine=\"echo\"} 1");
    has(&text, "lemon_run_duration_seconds_count{engine=\"echo\"} 1");
    has(&text, "lemon_run_duration_seconds_bucket{engine=\"claude\",le=\"0.1\"} 1");
    has(&text, "lemon_run_duration_seconds_bucket{engine=\"claude\",le=\"30\"} 1");
    has(&text, "lemon_run_duration_seconds_bucket{engine=\"claude\",le=\"60\"} 2");
    has(&text, "lemon_run_duration_seconds_sum{engine=\"claude\"} 40.1");
    has(&text, "lemon_run_duration_seconds_count{engine=\"claude\"} 2");

    // The first delta came 300 ms after the start; the second is not timed.
    has(&text, "lemon_run_first_delta_seconds_bucket{engine=\"echo\",le=\"0.25\"} 0");
    has(&text, "lemon_run_first_delta_seconds_bucket{engine=\"echo\",le=\"0.5\"} 1");
    has(&text, "lemon_run_first_delta_seconds_count{engine=\"echo\"} 1");
    has(&text, "lemon_run_first_delta_seconds_sum{engine=\"echo\"} 0.3");
    has(&text, "lemon_run_first_delta_seconds_count{engine=\"claude\"} 0");
    has(&text, "lemon_metrics_events_lost_total 0");
    c.stop().await;
}

#[tokio::test]
async fn spend_counts_the_usage_runs_report() {
    let mut c = Collecting::start();
    for (run, cost) in [("s1", 0.25), ("s2", 0.5)] {
        let mut done = Completion::success("ok", None);
        done.usage = json!({
            "total_cost_usd": cost,
            "usage": {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 7}
        });
        c.publish(run, 0, started("claude"));
        c.publish(run, 10, completed("claude", done, 10));
    }
    c.publish("s3", 0, started("echo"));
    c.publish("s3", 10, completed("echo", Completion::success("ok", None), 10));
    let text = c.text().await;
    has(&text, "# TYPE lemon_spend_usd_total counter");
    has(&text, "lemon_spend_usd_total{engine=\"claude\"} 0.75");
    has(&text, "lemon_spend_usd_total{engine=\"echo\"} 0");
    has(&text, "lemon_spend_tokens_total{engine=\"claude\",kind=\"input\"} 200");
    has(&text, "lemon_spend_tokens_total{engine=\"claude\",kind=\"output\"} 40");
    has(&text, "lemon_spend_tokens_total{engine=\"claude\",kind=\"cache_read\"} 14");
    has(&text, "lemon_spend_tokens_total{engine=\"claude\",kind=\"cache_write\"} 0");
    c.stop().await;
}

#[tokio::test]
async fn settled_approvals_are_counted_by_decision_and_surface() {
    use lemon_core::engine::{Action, ActionKind, ActionPhase};
    let settled = |answer: serde_json::Value| {
        EventKind::EngineAction(Action {
            id: "approval_c1".into(),
            kind: ActionKind::Approval,
            title: "approval: bash".into(),
            detail: json!({ "approval": { "id": "apr_000000000001" }, "answer": answer }),
            phase: ActionPhase::Completed,
            ok: Some(false),
            message: None,
            level: None,
            result_meta: serde_json::Value::Null,
        })
    };
    let mut c = Collecting::start();
    let by = |approved: bool, via: &str| json!({ "approved": approved, "by": "ann", "via": via });
    c.publish("a1", 0, settled(by(true, "telegram")));
    c.publish("a1", 1, settled(by(true, "telegram")));
    c.publish("a1", 2, settled(by(false, "api")));
    c.publish("a1", 3, settled(by(false, "a surface {\"made\"} up")));
    c.publish("a1", 4, settled(json!({ "expired": true })));
    c.publish("a1", 5, settled(serde_json::Value::Null));
    let text = c.text().await;
    has(&text, "# TYPE lemon_approvals_total counter");
    has(&text, "lemon_approvals_total{decision=\"approved\",via=\"telegram\"} 2");
    has(&text, "lemon_approvals_total{decision=\"denied\",via=\"api\"} 1");
    has(&text, "lemon_approvals_total{decision=\"denied\",via=\"other\"} 1");
    has(&text, "lemon_approvals_total{decision=\"expired\",via=\"none\"} 1");
    has(&text, "lemon_approvals_total{decision=\"withdrawn\",via=\"none\"} 1");
    c.stop().await;
}

#[tokio::test]
async fn engine_labels_are_bounded() {
    let mut c = Collecting::start();
    // The marker's engine first, so it is named.
    c.text().await;
    for i in 0..super::MAX_ENGINES + 5 {
        c.publish(&format!("e{i}"), 0, started(&format!("engine{i}")));
    }
    let text = c.text().await;
    let labels: std::collections::BTreeSet<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("lemon_runs_started_total{engine=\""))
        .filter_map(|rest| rest.split('"').next())
        .collect();
    // The marker's, 63 more, then `other` for the last 6.
    assert_eq!(labels.len(), super::MAX_ENGINES + 1, "{labels:?}");
    has(&text, "lemon_runs_started_total{engine=\"other\"} 6");
    c.stop().await;
}

#[test]
fn label_values_and_help_are_escaped() {
    assert_eq!(escape_label_value("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    let mut out = Exposition::default();
    out.family("x_total", Kind::Counter, "Back\\slash and\nnewline.");
    out.sample("x_total", &[("session", "chat \"42\"\n"), ("b", "\\")], 3);
    assert_eq!(
        out.finish(),
        "# HELP x_total Back\\\\slash and\\nnewline.\n# TYPE x_total counter\n\
         x_total{session=\"chat \\\"42\\\"\\n\",b=\"\\\\\"} 3\n"
    );
}

#[test]
fn histogram_buckets_are_cumulative_and_end_with_inf() {
    let mut out = Exposition::default();
    out.family("h_seconds", Kind::Histogram, "A histogram.");
    out.histogram("h_seconds", &[("engine", "echo")], &[0.5, 1.0], &[2, 0, 3], 7.25);
    assert_eq!(
        out.finish(),
        "# HELP h_seconds A histogram.\n# TYPE h_seconds histogram\n\
         h_seconds_bucket{engine=\"echo\",le=\"0.5\"} 2\n\
         h_seconds_bucket{engine=\"echo\",le=\"1\"} 2\n\
         h_seconds_bucket{engine=\"echo\",le=\"+Inf\"} 5\n\
         h_seconds_sum{engine=\"echo\"} 7.25\n\
         h_seconds_count{engine=\"echo\"} 5\n"
    );
}
