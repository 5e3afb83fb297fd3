//! What the CLI engine tests share: a harness that builds engines over the fake CLI
//! in a scratch directory, a started run whose events are awaited with a generous
//! timeout, a compact rendering of events, and process-group checks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lemon_core::engine::{Engine, EngineEvent, EventSink, ResumeToken, RunControl, StartRequest};
use lemon_core::ids::RunId;
use lemon_engines::cli::{ApiKey, CliContext, CliEngine, Vendor};
use lemon_engines::config::{EngineSection, EngineSections};
use lemon_tests::fake_cli::{fixture, FakeCliDir};
use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long any single expected event may take: a safety net, not a timing assertion.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// A secret the gateway holds that no child may see.
pub(crate) const GATEWAY_SECRET: (&str, &str) = ("LEMON_API_TOKEN", "gateway-secret-value");

/// The fake CLI on a temporary PATH, a HOME and a project directory for runs.
#[derive(Debug)]
pub(crate) struct Harness {
    pub(crate) fake: FakeCliDir,
    scratch: tempfile::TempDir,
    pub(crate) tracker: TaskTracker,
    pub(crate) shutdown: CancellationToken,
    pub(crate) api_keys: BTreeMap<String, ApiKey>,
}

impl Harness {
    pub(crate) fn new() -> Self {
        let fake = FakeCliDir::install(Path::new(env!("CARGO_BIN_EXE_fake-cli")))
            .expect("install the fake CLI");
        let scratch = tempfile::tempdir().expect("scratch dir");
        std::fs::create_dir_all(scratch.path().join("home")).expect("home dir");
        std::fs::create_dir_all(scratch.path().join("proj")).expect("project dir");
        Harness {
            fake,
            scratch,
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            api_keys: BTreeMap::new(),
        }
    }

    /// The run's working directory.
    pub(crate) fn cwd(&self) -> PathBuf {
        self.scratch.path().join("proj")
    }

    pub(crate) fn home(&self) -> PathBuf {
        self.scratch.path().join("home")
    }

    /// A path in the scratch directory (for pid, args and env files).
    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.scratch.path().join(name)
    }

    /// The gateway's environment as the app would pass it: PATH to the fake, a HOME,
    /// and a secret of the gateway's own.
    pub(crate) fn base_env(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("PATH".to_owned(), self.fake.search_path()),
            ("HOME".to_owned(), self.home().to_string_lossy().into_owned()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            (GATEWAY_SECRET.0.to_owned(), GATEWAY_SECRET.1.to_owned()),
        ])
    }

    pub(crate) fn context(&self) -> CliContext {
        CliContext {
            base_env: self.base_env(),
            search_path: None,
            tracker: self.tracker.clone(),
            shutdown: self.shutdown.clone(),
            api_keys: self.api_keys.clone(),
            recorder: None,
            ..CliContext::default()
        }
    }

    pub(crate) fn engine(&self, vendor: Vendor, section: &EngineSection) -> CliEngine {
        CliEngine::new(vendor, section, &self.context())
    }

    /// A copy of a fixture in the scratch directory, with `/home/dev/proj` made the
    /// run's cwd when `in_project`, and only its first `lines` lines when given.
    pub(crate) fn fixture(
        &self,
        vendor: Vendor,
        name: &str,
        in_project: bool,
        lines: Option<usize>,
    ) -> PathBuf {
        let text = std::fs::read_to_string(fixture(vendor.id(), name)).expect("fixture exists");
        let text = if in_project {
            text.replace("/home/dev/proj", &self.cwd().to_string_lossy())
        } else {
            text
        };
        let text: String = match lines {
            Some(n) => text.lines().take(n).map(|line| format!("{line}\n")).collect(),
            None => text,
        };
        let path = self.file(&format!("{}-{name}", vendor.id()));
        std::fs::write(&path, text).expect("write fixture copy");
        path
    }
}

/// A section whose `env` is `vars` (the fake's instructions) and otherwise defaults.
/// The engine sections of `config`, parsed as a start parses them.
pub(crate) fn sections_from(config: &str) -> EngineSections {
    let path = std::path::Path::new("config.toml");
    let loaded = lemon_core::config::load_str(config, path).expect("valid config");
    EngineSections::parse(&loaded.config.gateway.engines, path, config).expect("valid engines")
}

pub(crate) fn section(vars: &[(&str, String)]) -> EngineSection {
    EngineSection {
        env: vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
        ..EngineSection::default()
    }
}

pub(crate) fn request(prompt: &str, cwd: &Path, resume: Option<ResumeToken>) -> StartRequest {
    StartRequest {
        run_id: RunId::generate(),
        session_key: "test".into(),
        prompt: prompt.to_owned(),
        resume,
        cwd: cwd.to_path_buf(),
        model: None,
        meta: BTreeMap::new(),
        workspace: None,
        off_limits: lemon_core::contain::OffLimits::none(),
        attachments: Vec::new(),
    }
}

/// A started run: its control and the events it sends.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) control: Arc<dyn RunControl>,
    rx: mpsc::Receiver<EngineEvent>,
}

pub(crate) async fn start(engine: &dyn Engine, req: StartRequest) -> Run {
    let (sink, rx) = EventSink::channel(64);
    let control = engine.start(req, sink).await.expect("the run starts");
    Run { control, rx }
}

impl Run {
    /// The next event, or `None` when the engine dropped the sink.
    pub(crate) async fn next(&mut self) -> Option<EngineEvent> {
        tokio::time::timeout(PATIENCE, self.rx.recv())
            .await
            .expect("the engine sends an event or closes the sink")
    }

    /// Events up to and including the first that `stop` accepts.
    pub(crate) async fn until(&mut self, stop: impl Fn(&EngineEvent) -> bool) -> Vec<EngineEvent> {
        let mut events = Vec::new();
        loop {
            let event =
                self.next().await.unwrap_or_else(|| panic!("sink closed early after {events:?}"));
            let done = stop(&event);
            events.push(event);
            if done {
                return events;
            }
        }
    }

    /// Every event until the engine drops the sink.
    pub(crate) async fn until_closed(&mut self) -> Vec<EngineEvent> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

pub(crate) fn is_started(event: &EngineEvent) -> bool {
    matches!(event, EngineEvent::Started { .. })
}

pub(crate) fn is_completed(event: &EngineEvent) -> bool {
    matches!(event, EngineEvent::Completed(_))
}

pub(crate) fn describe_all(events: &[EngineEvent]) -> Vec<String> {
    events.iter().map(lemon_engines::cli::describe).collect()
}

/// Exactly one `Started`, first, and (when `completed`) exactly one `Completed`, last.
pub(crate) fn assert_well_ordered(events: &[EngineEvent], completed: bool) {
    let rendered = describe_all(events);
    assert!(events.first().is_some_and(is_started), "first event is Started: {rendered:#?}");
    assert_eq!(events.iter().filter(|e| is_started(e)).count(), 1, "one Started: {rendered:#?}");
    let n_completed = events.iter().filter(|e| is_completed(e)).count();
    if completed {
        assert_eq!(n_completed, 1, "one Completed: {rendered:#?}");
        assert!(events.last().is_some_and(is_completed), "Completed is last: {rendered:#?}");
    } else {
        assert_eq!(n_completed, 0, "no Completed: {rendered:#?}");
    }
}

/// The pids the fake wrote to `FAKE_CLI_PID_FILE`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FakePids {
    pub(crate) pid: i32,
    pub(crate) pgid: i32,
    pub(crate) grandchild: Option<i32>,
}

pub(crate) fn read_pids(path: &Path) -> FakePids {
    let text =
        std::fs::read_to_string(path).expect("the fake wrote its pid file before its first line");
    let value: serde_json::Value = serde_json::from_str(&text).expect("pid file is JSON");
    let int = |key: &str| {
        value.get(key).and_then(serde_json::Value::as_i64).map(|n| i32::try_from(n).expect("pid"))
    };
    FakePids {
        pid: int("pid").expect("pid"),
        pgid: int("pgid").expect("pgid"),
        grandchild: int("grandchild"),
    }
}

/// Processes of group `pgid` that are still running (zombies waiting for init to
/// reap them do not count: they have exited).
fn live_members(pgid: i32) -> Vec<i32> {
    if kill(Pid::from_raw(-pgid), None) == Err(Errno::ESRCH) {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
            let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else { return false };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let alive = fields.first().is_some_and(|state| *state != "Z" && *state != "X");
            alive && fields.get(2).and_then(|pgrp| pgrp.parse::<i32>().ok()) == Some(pgid)
        })
        .collect()
}

/// Waits until no process of the fake's group is running, the grandchild included.
/// SIGKILL takes effect asynchronously, so this polls (briefly) for the kernel to
/// finish what the engine already did.
pub(crate) async fn assert_group_gone(pids: FakePids) {
    assert_eq!(pids.pid, pids.pgid, "the CLI leads its own process group");
    let gone = async {
        loop {
            if live_members(pids.pgid).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(PATIENCE, gone).await.is_err() {
        panic!("process group {} still has live members {:?}", pids.pgid, live_members(pids.pgid));
    }
    if let Some(grandchild) = pids.grandchild {
        let stat = std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z "),
            "grandchild {grandchild} is gone: {stat}"
        );
    }
}

/// What the fake recorded in `FAKE_CLI_ARGS_FILE`: its argv, cwd and stdin.
#[derive(Debug)]
pub(crate) struct Recorded {
    pub(crate) argv: Vec<String>,
    pub(crate) cwd: String,
    pub(crate) stdin: String,
}

pub(crate) fn read_args(path: &Path) -> Recorded {
    let text = std::fs::read_to_string(path).expect("the fake wrote its args file");
    let (header, stdin) = text.split_once('\n').expect("header line");
    let header: serde_json::Value = serde_json::from_str(header).expect("header is JSON");
    Recorded {
        argv: serde_json::from_value(header["argv"].clone()).expect("argv"),
        cwd: header["cwd"].as_str().expect("cwd").to_owned(),
        stdin: stdin.to_owned(),
    }
}

/// A fixture per vendor that ends in a successful completion.
pub(crate) fn success_fixture(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Claude => "synth_tool_use_success.jsonl",
        Vendor::Codex => "test_full_lifecycle.jsonl",
        Vendor::Opencode => "synth_from_runner_test_structs.jsonl",
        Vendor::Pi => "synth_from_runner_test_structs.jsonl",
        Vendor::Droid => "test_decode_samples_run.jsonl",
    }
}
