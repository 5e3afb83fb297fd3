//! What the fault tests share: the fake CLI as Claude, waits on a run's event
//! stream, and what `/proc` says about processes (alive, memory, leftovers).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;

use crate::support::{Gateway, PATIENCE};

/// The first line of a Claude stream (its `init`): the run starts and, with
/// `FAKE_CLI_HANG`, never ends by itself.
pub(crate) fn init_only_fixture(dir: &Path) -> PathBuf {
    let source = lemon_tests::fake_cli::fixture("claude", "synth_tool_use_success.jsonl");
    let text = std::fs::read_to_string(source).unwrap();
    let path = dir.join("init-only.jsonl");
    std::fs::write(&path, format!("{}\n", text.lines().next().unwrap())).unwrap();
    path
}

/// A whole successful Claude stream; its answer is [`SUCCESS_ANSWER`].
pub(crate) fn success_fixture() -> PathBuf {
    lemon_tests::fake_cli::fixture("claude", "synth_tool_use_success.jsonl")
}

/// `[gateway.engines.claude]` on the fake CLI with `env` (name, value) and the
/// `extra` keys, and `claude` as the default engine.
pub(crate) fn claude_config(env: &[(&str, String)], extra: &str) -> String {
    let env: Vec<String> = env.iter().map(|(name, value)| format!("{name} = {value:?}")).collect();
    format!(
        "[gateway]\ndefault_engine = \"claude\"\n[gateway.engines.claude]\ncli_path = \"{}\"\n{extra}\nenv = {{ {} }}\n",
        env!("CARGO_BIN_EXE_fake-cli"),
        env.join(", ")
    )
}

/// What `/proc/<pid>/stat` says: (alive, start time). A zombie has exited.
pub(crate) fn stat(pid: i32) -> Option<(bool, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let alive = fields[0] != "Z" && fields[0] != "X";
    Some((alive, fields[19].parse().ok()?))
}

pub(crate) fn alive(pid: i32) -> bool {
    stat(pid).is_some_and(|(alive, _)| alive)
}

/// Resident memory of `pid` in KiB (`VmRSS` of `/proc/<pid>/status`).
pub(crate) fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// Live processes whose environment holds `NAME=value` (`entry`): every process
/// the fake CLI of one test started carries that test's own paths.
pub(crate) fn live_with_env(entry: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| alive(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// Polls (bounded) until `done`: the kernel acts on signals in its own time.
pub(crate) async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}");
}

/// Reads the run's event stream until an event of type `kind` has arrived.
pub(crate) async fn until_event(gateway: &Gateway, run_id: &str, kind: &str) {
    let response = gateway.get(&format!("/v1/runs/{run_id}/events")).send().await.unwrap();
    let mut parser = lemon_tests::event_stream::EventStream::default();
    let mut stream = response.bytes_stream();
    let seen = tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = stream.next().await {
            if parser.push(&chunk.unwrap()).iter().any(|event| event.event == kind) {
                return;
            }
        }
        panic!("stream of {run_id} ended before {kind}");
    })
    .await;
    assert!(seen.is_ok(), "{kind} of {run_id} in time");
}

/// How many `run_completed` events the run's stream has (it ends after one).
pub(crate) async fn completions(gateway: &Gateway, run_id: &str) -> usize {
    gateway.events(run_id).await.iter().filter(|(kind, _)| kind == "run_completed").count()
}

/// The pids the fake wrote to `FAKE_CLI_PID_FILE`: its own and its grandchild's.
pub(crate) async fn pids(path: &Path) -> (i32, Option<i32>) {
    eventually("the fake CLI writes its pid file", || path.exists()).await;
    let value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let pid = |key: &str| value[key].as_i64().map(|pid| i32::try_from(pid).unwrap());
    (pid("pid").unwrap(), pid("grandchild"))
}

/// `lemon_outbox_calls_total{transport}` by outcome, as `/metrics` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct OutboxCalls {
    pub(crate) sent: u64,
    pub(crate) retried: u64,
    pub(crate) rate_limited: u64,
    pub(crate) failed: u64,
}

/// The outbox calls of `transport` from `/metrics`, once `done` holds for them
/// (the counts follow the answers the gateway reads, a moment after the fake
/// sent them); fails after `PATIENCE` with the last counts.
pub(crate) async fn outbox_calls(
    gateway: &Gateway,
    transport: &str,
    done: impl Fn(&OutboxCalls) -> bool,
) -> OutboxCalls {
    let read = || async {
        let url = format!("{}/metrics", gateway.health);
        let text = gateway.http.get(url).send().await.unwrap().text().await.unwrap();
        let scrape = lemon_tests::prometheus::Scrape::parse(&text)
            .unwrap_or_else(|error| panic!("{error}\n{text}"));
        let value = |outcome: &str| {
            let labels = [("transport", transport), ("outcome", outcome)];
            // Absent until the transport's outbox exists: none yet.
            scrape.value("lemon_outbox_calls_total", &labels).map_or(0, |n| n as u64)
        };
        OutboxCalls {
            sent: value("sent"),
            retried: value("retried"),
            rate_limited: value("rate_limited"),
            failed: value("failed"),
        }
    };
    let mut last = OutboxCalls::default();
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            last = read().await;
            if done(&last) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the outbox calls of {transport} never matched: last {last:?}");
    last
}
