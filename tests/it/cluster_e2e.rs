//! Three real gateway nodes in cluster mode on one PostgreSQL server, under
//! traffic through every node's API and one Telegram bot, with faults injected
//! while it flows: `kill -9` of a node, `SIGSTOP` of a node's process group
//! for longer than its lease (it must come back fenced, exit with code 75 and
//! write nothing), `pg_terminate_backend` of a node's connections, and a
//! network partition of the node that lives in a network namespace of its own
//! (its veth link set down for longer than its lease, then up: it too must
//! come back fenced). The long variant (`LEMON_CLUSTER_LONG=1`) sends more and
//! adds `pg_ctl restart -m immediate`.
//!
//! The history is recorded from the outside (what the APIs answered, the fake
//! CLI's engine intervals on `CLOCK_MONOTONIC`, the store's completions, the
//! Bot API's pollers through one recording proxy per node, what followers on
//! other nodes saw) and judged by [`lemon_tests::history`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use lemon_core::store::postgres::testing::server_url;
use lemon_tests::fake_telegram::{ChatSpec, FakeTelegram};
use lemon_tests::history::{
    engine_spans, monotonic_ns, Accepted, Completion, Down, Follow, History, Poll,
};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::json;
use tokio::task::JoinSet;

use crate::netns::Netns;
use crate::support::{
    command_through, command_with_path, write_config, Gateway, TOKEN, TRUST_EVERY_CALL,
};

/// Engines running at once, across the cluster.
const CAP: usize = 3;
/// Every lease's term.
const TERM: Duration = Duration::from_secs(3);
const NODES: usize = 3;
/// The node that lives in a network namespace of its own, to be partitioned.
const PARTITIONED: usize = 2;
const BOT_TOKEN: &str = "4242:cluster-bot-token";
const BOT_ID: i64 = 4242;
/// The private chats of the bot's users (the chat id is the user id).
const FIRST_USER: i64 = 7001;
/// The exit status of a node that lost its leases.
const FENCED_EXIT: i32 = 75;

/// How much traffic, and which faults.
#[derive(Debug, Clone, Copy)]
struct Plan {
    conversations: usize,
    messages: usize,
    chats: usize,
    chat_messages: usize,
    /// Adds `pg_ctl restart -m immediate`.
    long: bool,
    /// How long a follower waits for its run's completion (a run may wait
    /// long behind the others under load); a lost run shows as missing once
    /// the followers gave up.
    follow_patience: Duration,
}

impl Plan {
    fn from_env() -> Plan {
        if std::env::var("LEMON_CLUSTER_LONG").is_ok_and(|v| v == "1") {
            Plan {
                conversations: 60,
                messages: 16,
                chats: 8,
                chat_messages: 10,
                long: true,
                follow_patience: Duration::from_secs(300),
            }
        } else {
            Plan {
                conversations: 24,
                messages: 10,
                chats: 4,
                chat_messages: 6,
                long: false,
                follow_patience: Duration::from_secs(120),
            }
        }
    }
}

/// A PostgreSQL server of the test's own (`scripts/postgres`), so that it
/// can be restarted; stopped on drop.
struct OwnServer {
    dir: tempfile::TempDir,
    url: String,
}

fn postgres_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/postgres")
}

impl OwnServer {
    /// Listening on loopback and on the host's side of `netns`, for the node
    /// inside it.
    async fn start(netns: &Netns) -> OwnServer {
        let dir = tempfile::tempdir().unwrap();
        let output = tokio::process::Command::new(postgres_script())
            .arg("start")
            .arg(dir.path().join("pg"))
            .env("LEMON_PG_LISTEN", netns.host_addr.to_string())
            .env("LEMON_PG_CLIENTS", netns.cidr())
            .output()
            .await
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let url = String::from_utf8(output.stdout).unwrap().trim().to_owned();
        OwnServer { dir, url }
    }

    fn port(&self) -> u16 {
        let host = self.url.rsplit('@').next().unwrap();
        host.split(['/', ':']).nth(1).unwrap().parse().unwrap()
    }

    /// `pg_ctl restart -m immediate`: every connection cut, crash recovery.
    async fn restart_immediately(&self) {
        let status = tokio::process::Command::new(postgres_script())
            .arg("restart")
            .arg(self.dir.path().join("pg"))
            .status()
            .await
            .unwrap();
        assert!(status.success());
    }

    /// A connection of the test's own, for reading the store and for faults.
    async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) =
            tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new(postgres_script())
            .arg("stop")
            .arg(self.dir.path().join("pg"))
            .status();
    }
}

/// The `getUpdates` calls each node made, through its own proxy to the fake.
type Polls = Arc<Mutex<Vec<Poll>>>;

#[derive(Clone)]
struct ProxyState {
    node: String,
    upstream: String,
    http: reqwest::Client,
    polls: Polls,
}

/// Ends a recorded poll when the call is answered or given up.
struct PollGuard {
    polls: Polls,
    index: usize,
}

impl Drop for PollGuard {
    fn drop(&mut self) {
        let mut polls = self.polls.lock().unwrap_or_else(PoisonError::into_inner);
        polls[self.index].end_ns.get_or_insert_with(monotonic_ns);
    }
}

async fn forward(
    State(state): State<ProxyState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let _poll = uri.path().ends_with("/getUpdates").then(|| {
        let mut polls = state.polls.lock().unwrap_or_else(PoisonError::into_inner);
        polls.push(Poll { node: state.node.clone(), start_ns: monotonic_ns(), end_ns: None });
        PollGuard { polls: state.polls.clone(), index: polls.len() - 1 }
    });
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = state.http.request(method, format!("{}{path}", state.upstream)).body(body);
    if let Some(kind) = headers.get(axum::http::header::CONTENT_TYPE) {
        request = request.header(axum::http::header::CONTENT_TYPE, kind);
    }
    match request.send().await {
        Ok(answer) => {
            let status = StatusCode::from_u16(answer.status().as_u16()).unwrap();
            let kind = answer.headers().get(axum::http::header::CONTENT_TYPE).cloned();
            let bytes = answer.bytes().await.unwrap_or_default();
            let mut response = (status, bytes).into_response();
            if let Some(kind) = kind {
                response.headers_mut().insert(axum::http::header::CONTENT_TYPE, kind);
            }
            response
        }
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// Starts a recording proxy for `node` in front of `upstream`, listening on
/// `host`; its base URL.
async fn proxy(node: &str, host: &str, upstream: String, polls: Polls) -> String {
    let state = ProxyState { node: node.to_owned(), upstream, http: reqwest::Client::new(), polls };
    let app = axum::Router::new().fallback(forward).with_state(state);
    let listener = tokio::net::TcpListener::bind((host, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// One node: its home, its current process and API address (`None` while down).
struct Node {
    name: String,
    home: PathBuf,
    gateway: Option<Gateway>,
    starts: usize,
}

/// The cluster under test and what the harness recorded about it.
struct Cluster {
    dir: tempfile::TempDir,
    pg: OwnServer,
    nodes: Vec<Node>,
    /// Where node [`PARTITIONED`] lives; dropped after the nodes.
    netns: Netns,
    /// Each node's API address, `None` while it is down; read by the traffic.
    apis: Arc<Mutex<Vec<Option<String>>>>,
    down: Vec<Down>,
    /// What was done to the cluster, and when.
    faults: Vec<(String, u64)>,
}

impl Cluster {
    /// Each node's engines log their runs to a file of the node's own.
    fn run_log(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("runs-{node}.log"))
    }

    /// Every node's run log: the node, and its engine spans.
    fn engines_by_node(&self) -> Vec<(String, Vec<lemon_tests::history::EngineSpan>)> {
        self.nodes
            .iter()
            .map(|node| {
                let log = std::fs::read_to_string(self.run_log(&node.name)).unwrap_or_default();
                (node.name.clone(), engine_spans(&log))
            })
            .collect()
    }

    /// Notes a fault (or its end) with its time, for the report.
    fn mark(&mut self, what: impl Into<String>) {
        self.faults.push((what.into(), monotonic_ns()));
    }

    /// Starts node `n` (again) and waits for its ready line.
    async fn start_node(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        let log = node.home.join(format!("gateway-{}.log", node.starts));
        node.starts += 1;
        let mut command = if n == PARTITIONED {
            command_through(&node.home, &self.netns.exec_prefix())
        } else {
            command_with_path(&node.home, &std::env::var("PATH").unwrap_or_default())
        };
        // Its own process group, so that SIGSTOP reaches the whole node.
        command.process_group(0);
        let gateway = Gateway::spawn_logging_to(command, &node.home, &log).await;
        self.apis.lock().unwrap()[n] = Some(gateway.api.clone());
        node.gateway = Some(gateway);
    }

    fn pid(&self, n: usize) -> i32 {
        self.nodes[n].gateway.as_ref().expect("the node runs").pid()
    }

    /// `kill -9` of node `n`; returns when it is gone.
    async fn kill(&mut self, n: usize) -> u64 {
        self.apis.lock().unwrap()[n] = None;
        let mut gateway = self.nodes[n].gateway.take().expect("the node runs");
        let at = monotonic_ns();
        gateway.child.start_kill().unwrap();
        gateway.child.wait().await.unwrap();
        at
    }

    /// `SIGSTOP` of node `n`'s process group for `how_long`, then `SIGCONT`;
    /// returns the node's exit status, which a fenced node gives by itself.
    async fn stop_for(&mut self, n: usize, how_long: Duration) -> Option<i32> {
        self.apis.lock().unwrap()[n] = None;
        let group = Pid::from_raw(self.pid(n));
        let from_ns = monotonic_ns();
        killpg(group, Signal::SIGSTOP).unwrap();
        tokio::time::sleep(how_long).await;
        killpg(group, Signal::SIGCONT).unwrap();
        self.mark(format!("SIGCONT {}", self.nodes[n].name));
        let mut gateway = self.nodes[n].gateway.take().unwrap();
        let code = exit_code_within(&mut gateway, TERM * 5).await;
        self.down.push(Down {
            node: self.nodes[n].name.clone(),
            from_ns,
            to_ns: Some(monotonic_ns()),
        });
        code
    }

    /// Partitions node [`PARTITIONED`] from everything for `how_long`, then
    /// heals the partition; returns the node's exit status, which a fenced
    /// node gives by itself, and restarts it as a supervisor would.
    async fn partition_for(&mut self, how_long: Duration) -> Option<i32> {
        let n = PARTITIONED;
        self.netns.cut();
        tokio::time::sleep(how_long).await;
        self.netns.heal();
        self.mark("the partition healed");
        let mut gateway = self.nodes[n].gateway.take().expect("the node runs");
        let code = exit_code_within(&mut gateway, TERM * 5).await;
        self.apis.lock().unwrap()[n] = None;
        let from_ns = monotonic_ns();
        self.start_node(n).await;
        self.down.push(Down {
            node: self.nodes[n].name.clone(),
            from_ns,
            to_ns: Some(monotonic_ns()),
        });
        code
    }

    /// Starts again, as a supervisor would, every node that exited by itself
    /// (a node that lost its leases exits fenced); down since `since_ns`. The
    /// names and exit statuses of the nodes restarted.
    async fn restart_exited(&mut self, since_ns: u64) -> Vec<(String, Option<i32>)> {
        let mut restarted = Vec::new();
        for n in 0..self.nodes.len() {
            let Some(gateway) = self.nodes[n].gateway.as_mut() else { continue };
            let Some(status) = gateway.child.try_wait().unwrap() else { continue };
            self.apis.lock().unwrap()[n] = None;
            self.nodes[n].gateway = None;
            self.start_node(n).await;
            let name = self.nodes[n].name.clone();
            self.down.push(Down {
                node: name.clone(),
                from_ns: since_ns,
                to_ns: Some(monotonic_ns()),
            });
            restarted.push((name, status.code()));
        }
        restarted
    }

    /// `pg_terminate_backend` of every connection node `n` holds; how many.
    async fn terminate_connections(&self, n: usize) -> usize {
        let ports = tcp_ports_to(self.pid(n), self.pg.port());
        let ports: Vec<i32> = ports.into_iter().map(i32::from).collect();
        let client = self.pg.client().await;
        let rows = client
            .query(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_port = ANY($1)",
                &[&ports],
            )
            .await
            .unwrap();
        rows.len()
    }
}

/// The exit code `gateway` gives by itself within `patience` (a fenced node
/// exits); `None` when it is still running then, and it is killed so that
/// the test goes on.
async fn exit_code_within(gateway: &mut Gateway, patience: Duration) -> Option<i32> {
    match tokio::time::timeout(patience, gateway.child.wait()).await {
        Ok(status) => status.unwrap().code(),
        Err(_) => {
            gateway.child.start_kill().unwrap();
            gateway.child.wait().await.unwrap();
            None
        }
    }
}

/// The local ports of `pid`'s TCP connections to `remote_port` (in its own
/// network namespace's table).
fn tcp_ports_to(pid: i32, remote_port: u16) -> Vec<u16> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|entry| {
                let target = std::fs::read_link(entry.ok()?.path()).ok()?;
                let target = target.to_str()?;
                Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
            })
            .collect()
        })
        .unwrap_or_default();
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let port_of = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
            (port_of(remote)? == remote_port && inodes.iter().any(|i| i == inode))
                .then(|| port_of(local))
                .flatten()
        })
        .collect()
}

/// The node config: the fake CLI as Claude, logging its runs; the store and
/// the cluster; the bot, polling through the node's proxy; the listeners on
/// `host`.
fn node_config(
    node: &str,
    cli_env: &str,
    store_secret: &str,
    telegram: &str,
    chats: &str,
    host: &str,
) -> String {
    format!(
        "[gateway]\nmax_concurrent_runs = {CAP}\ndefault_engine = \"claude\"\nenable_telegram = true\n\
         [gateway.engines.claude]\ncli_path = \"{cli}\"\nenv = {{ {cli_env} }}\n\
         [gateway.store]\nbackend = \"postgres\"\nurl_secret = \"{store_secret}\"\npool_size = 4\n\
         [gateway.cluster]\nenabled = true\nnode_id = \"{node}\"\nlease_term_ms = {term}\n\
         [gateway.telegram]\nbot_token = \"{BOT_TOKEN}\"\napi_base_url = \"{telegram}\"\npoll_timeout_s = 2\n\
         allowed_chat_ids = [{chats}]\n\
         [gateway.api]\nbind = \"{host}\"\nport = 0\n[gateway.health]\nbind = \"{host}\"\nport = 0\n\
         {TRUST_EVERY_CALL}",
        cli = env!("CARGO_BIN_EXE_fake-cli"),
        term = TERM.as_millis(),
    )
}

fn write_secret(home: &Path, url: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    std::fs::write(&path, format!("store_url = \"{url}\"\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A number from `seed` spread over `0..span` (a fixed, varied schedule).
fn spread(seed: u64, span: u64) -> u64 {
    let mixed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ 0xA076_1D64_78BD_642F;
    mixed.wrapping_mul(0xE703_7ED1_A0B4_28DB) % span
}

/// Posts message `m` of conversation `c` until a node acknowledges it (the
/// same run id again is the same run), preferring node `first`.
async fn submit(
    http: &reqwest::Client,
    apis: &Mutex<Vec<Option<String>>>,
    c: usize,
    m: usize,
) -> usize {
    let run_id = format!("c{c:02}-m{m:02}");
    let body = json!({ "prompt": format!("msg:{run_id}"), "run_id": run_id, "session_key": format!("conv-{c:02}") });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut attempt = c + m;
    loop {
        assert!(tokio::time::Instant::now() < deadline, "no node accepted {run_id}");
        let n = attempt % NODES;
        attempt += 1;
        let Some(api) = apis.lock().unwrap()[n].clone() else { continue };
        let sent = http
            .post(format!("{api}/v1/runs"))
            .bearer_auth(TOKEN)
            .timeout(Duration::from_secs(2))
            .json(&body)
            .send()
            .await;
        match sent.map(|r| (r.status().as_u16(), retry_after(&r))) {
            Ok((202, _)) => return n,
            // Not durable (the store is away), or no answer: another node, later.
            Ok((503, _)) | Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            // Over this client's rate (followers reconnecting after a fault
            // count too): as long as the node asks.
            Ok((429, wait)) => tokio::time::sleep(wait).await,
            Ok((other, _)) => panic!("submit of {run_id} to node {n}: {other}"),
        }
    }
}

/// How long a `429` asks the client to wait (`Retry-After`, at most 2 s).
fn retry_after(response: &reqwest::Response) -> Duration {
    let seconds = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok()?.trim().parse::<u64>().ok())
        .unwrap_or(1);
    Duration::from_secs(seconds.clamp(1, 2))
}

/// Follows `run_id`'s events on the nodes other than `accepted_by`, resuming
/// with `Last-Event-ID` on another node when a stream breaks or stalls; the
/// indexes seen, in order.
async fn follow(
    http: reqwest::Client,
    apis: Arc<Mutex<Vec<Option<String>>>>,
    run_id: String,
    accepted_by: usize,
    patience: Duration,
) -> Vec<u64> {
    let mut seen: Vec<u64> = Vec::new();
    let deadline = tokio::time::Instant::now() + patience;
    let mut next = accepted_by + 1;
    while tokio::time::Instant::now() < deadline {
        let mut n = next % NODES;
        next += 1;
        if n == accepted_by {
            n = next % NODES;
            next += 1;
        }
        let Some(api) = apis.lock().unwrap()[n].clone() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut request = http.get(format!("{api}/v1/runs/{run_id}/events")).bearer_auth(TOKEN);
        if let Some(last) = seen.last() {
            request = request.header("last-event-id", last.to_string());
        }
        let Ok(response) = tokio::time::timeout(Duration::from_secs(3), request.send()).await
        else {
            continue;
        };
        let Ok(response) = response else { continue };
        if !response.status().is_success() {
            let wait = if response.status().as_u16() == 429 {
                retry_after(&response)
            } else {
                Duration::from_millis(100)
            };
            tokio::time::sleep(wait).await;
            continue;
        }
        let mut stream = response.bytes_stream();
        let mut buffer = String::new();
        let (mut id, mut kind) = (None, String::new());
        // The lines of the event being read, to show one that breaks the rules.
        let mut frame = String::new();
        // A stream quiet for this long may be on a stopped node: go elsewhere.
        while let Ok(Some(Ok(chunk))) =
            tokio::time::timeout(Duration::from_secs(4), stream.next()).await
        {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find('\n') {
                let line: String = buffer.drain(..=end).collect();
                let line = line.trim_end_matches(['\n', '\r']);
                frame.push_str(line);
                frame.push('\n');
                if let Some(value) = line.strip_prefix("id:") {
                    id = value.trim().parse::<u64>().ok();
                } else if let Some(value) = line.strip_prefix("event:") {
                    value.trim().clone_into(&mut kind);
                } else if line.is_empty() {
                    let index = id.take();
                    if let Some(index) = index {
                        seen.push(index);
                    }
                    if std::mem::take(&mut kind) == "run_completed" {
                        if index.is_none() {
                            #[allow(clippy::print_stderr)]
                            {
                                eprintln!(
                                    "{run_id} on node-{}: run_completed without an id:\n{frame}",
                                    n + 1
                                );
                            }
                        }
                        return seen;
                    }
                    frame.clear();
                }
            }
        }
    }
    seen
}

/// The runs the store holds: (run id, prompt, error code, error, completions).
async fn stored_runs(
    client: &tokio_postgres::Client,
) -> Vec<(String, String, Option<String>, Option<String>, i64)> {
    client
        .query(
            "SELECT r.run_id, r.prompt, r.error_code, r.error, \
             (SELECT count(*) FROM run_events e WHERE e.run_id = r.run_id AND e.kind = 'run_completed') \
             FROM runs r",
            &[],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4)))
        .collect()
}

/// The `msg:<run>` words of a prompt, in order: what the fake CLI logs too.
fn prompt_runs(prompt: &str) -> Vec<String> {
    prompt
        .split("msg:")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect::<String>()
        })
        .filter(|run| !run.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_under_faults_keep_the_cap_the_order_and_exactly_one_completion() {
    if server_url().is_none() {
        return;
    }
    let plan = Plan::from_env();
    let began = tokio::time::Instant::now();
    let netns = Netns::create();
    let pg = OwnServer::start(&netns).await;
    let fake = FakeTelegram::start(&[(BOT_TOKEN, BOT_ID, "cluster_bot")]).await;
    let users: Vec<i64> = (0..plan.chats as i64).map(|n| FIRST_USER + n).collect();
    for user in &users {
        fake.add_chat(&ChatSpec::private(*user));
    }
    let chats = users.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    let polls: Polls = Arc::default();
    let dir = tempfile::tempdir().unwrap();
    let fixture = lemon_tests::fake_cli::fixture("claude", "synth_tool_use_success.jsonl");
    let mut nodes = Vec::new();
    for n in 0..NODES {
        let name = format!("node-{}", n + 1);
        let cli_env = format!(
            "FAKE_CLI_FIXTURE = {:?}, FAKE_CLI_LINE_DELAY_MS = \"25\", FAKE_CLI_RUN_LOG = {:?}",
            fixture.to_str().unwrap(),
            dir.path().join(format!("runs-{name}.log")).to_str().unwrap()
        );
        let home = dir.path().join(&name);
        std::fs::create_dir_all(&home).unwrap();
        // The partitioned node reaches the others, and they it, over its link.
        let (host, store_host) = if n == PARTITIONED {
            (netns.inside_addr.to_string(), netns.host_addr.to_string())
        } else {
            ("127.0.0.1".to_owned(), "127.0.0.1".to_owned())
        };
        let telegram = proxy(&name, &store_host, fake.base_url(), polls.clone()).await;
        write_config(&home, &node_config(&name, &cli_env, "store_url", &telegram, &chats, &host));
        write_secret(&home, &pg.url.replace("@127.0.0.1:", &format!("@{store_host}:")));
        nodes.push(Node { name, home, gateway: None, starts: 0 });
    }
    let mut cluster = Cluster {
        dir,
        pg,
        netns,
        nodes,
        apis: Arc::new(Mutex::new(vec![None; NODES])),
        down: Vec::new(),
        faults: Vec::new(),
    };
    for n in 0..NODES {
        cluster.start_node(n).await;
    }
    let engines_of = |cluster: &Cluster| -> Vec<lemon_tests::history::EngineSpan> {
        cluster.engines_by_node().into_iter().flat_map(|(_, spans)| spans).collect()
    };

    // The traffic: each conversation sends its messages one after the other
    // (the next once a node acknowledged the last), through every node; each
    // run is followed on a node other than the one that accepted it.
    let http = reqwest::Client::new();
    let mut traffic = JoinSet::new();
    for c in 0..plan.conversations {
        let (http, apis) = (http.clone(), cluster.apis.clone());
        traffic.spawn(async move {
            let mut followers = Vec::new();
            tokio::time::sleep(Duration::from_millis(spread(c as u64, 1_000))).await;
            for m in 0..plan.messages {
                let by = submit(&http, &apis, c, m).await;
                let run_id = format!("c{c:02}-m{m:02}");
                let follower = tokio::spawn(follow(
                    http.clone(),
                    apis.clone(),
                    run_id.clone(),
                    by,
                    plan.follow_patience,
                ));
                followers.push((run_id, follower));
                let gap = 300 + spread((c * 1000 + m) as u64, 1_500);
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
            let mut seen = Vec::new();
            for (run_id, follower) in followers {
                seen.push((run_id, follower.await.unwrap()));
            }
            seen
        });
    }
    let chat_traffic = {
        let fake = fake.clone();
        let users = users.clone();
        tokio::spawn(async move {
            for m in 0..plan.chat_messages {
                for (c, user) in users.iter().enumerate() {
                    fake.inject_text(&ChatSpec::private(*user), *user, &format!("msg:tg-{c}-{m}"));
                }
                tokio::time::sleep(Duration::from_millis(1_500)).await;
            }
        })
    };

    // The faults, while the traffic flows: the node polling the bot is
    // killed (the bot must move), another is stopped past its lease, the
    // third loses its database connections.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let poller = polls.lock().unwrap().last().map(|poll| poll.node.clone());
    let victim =
        cluster.nodes.iter().position(|node| Some(&node.name) == poller.as_ref()).unwrap_or(2);
    let (stopped, cut_off) = ((victim + 1) % NODES, (victim + 2) % NODES);
    cluster.mark(format!("kill -9 node-{}", victim + 1));
    let killed_at = cluster.kill(victim).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.mark(format!("pg_terminate_backend of node-{}", cut_off + 1));
    let cut = cluster.terminate_connections(cut_off).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.start_node(victim).await;
    cluster.mark(format!("node-{} restarted", victim + 1));
    cluster.down.push(Down {
        node: cluster.nodes[victim].name.clone(),
        from_ns: killed_at,
        to_ns: Some(monotonic_ns()),
    });
    cluster.mark(format!("SIGSTOP node-{}", stopped + 1));
    let fenced_exit = cluster.stop_for(stopped, TERM * 3 / 2).await;
    cluster.mark(format!("node-{} exited, restarting", stopped + 1));
    cluster.start_node(stopped).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.mark(format!("partition of node-{}", PARTITIONED + 1));
    let partitioned_exit = cluster.partition_for(TERM * 2).await;
    cluster.mark(format!("node-{} restarted after the partition", PARTITIONED + 1));
    if plan.long {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let restarted_at = monotonic_ns();
        cluster.mark("pg_ctl restart -m immediate");
        cluster.pg.restart_immediately().await;
        // Nodes that could not renew their leases meanwhile exit fenced; the
        // harness is their supervisor.
        tokio::time::sleep(TERM * 2).await;
        let restarted = cluster.restart_exited(restarted_at).await;
        #[allow(clippy::print_stderr)]
        {
            eprintln!("after the database's restart, restarted {restarted:?}");
        }
    }
    let healed = tokio::time::Instant::now();

    let mut follows = Vec::new();
    while let Some(seen) = traffic.join_next().await {
        follows.extend(seen.unwrap());
    }
    chat_traffic.await.unwrap();

    // Every accepted message completes once the faults have healed.
    let client = cluster.pg.client().await;
    let mut expected: Vec<String> = (0..plan.conversations)
        .flat_map(|c| (0..plan.messages).map(move |m| format!("c{c:02}-m{m:02}")))
        .collect();
    expected.extend(
        (0..plan.chats).flat_map(|c| (0..plan.chat_messages).map(move |m| format!("tg-{c}-{m}"))),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let waited = loop {
        let completed: std::collections::HashSet<String> = stored_runs(&client)
            .await
            .into_iter()
            .filter(|run| run.4 >= 1)
            .filter_map(|run| prompt_runs(&run.1).pop())
            .collect();
        if expected.iter().all(|word| completed.contains(word)) {
            break true;
        }
        if tokio::time::Instant::now() > deadline {
            break false;
        }
        // A node that exits by itself from here on is a failure of its own,
        // but the others must still finish its work.
        let since = monotonic_ns();
        if let Some((node, code)) = cluster.restart_exited(since).await.first() {
            panic!("{node} exited ({code:?}) after the faults had healed");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let settled = healed.elapsed();
    // Every engine process has ended (a killed one is logged by its witness).
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if engines_of(&cluster).iter().all(|span| span.end_ns.is_some()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;

    // The history.
    let runs = stored_runs(&client).await;
    // A chat message's run is known by the word its prompt ends with; an API
    // run's id is that word.
    let own_word: HashMap<String, String> = runs
        .iter()
        .filter_map(|(run_id, prompt, ..)| Some((run_id.clone(), prompt_runs(prompt).pop()?)))
        .collect();
    let mut accepted = Vec::new();
    for c in 0..plan.conversations {
        for m in 0..plan.messages {
            accepted.push(Accepted {
                run_id: format!("c{c:02}-m{m:02}"),
                conversation: format!("conv-{c:02}"),
                order: m as u64,
            });
        }
    }
    for c in 0..plan.chats {
        for m in 0..plan.chat_messages {
            accepted.push(Accepted {
                run_id: format!("tg-{c}-{m}"),
                conversation: format!("chat-{c}"),
                order: m as u64,
            });
        }
    }
    let mut completions: HashMap<String, Completion> = HashMap::new();
    for (run_id, _, error_code, error, count) in &runs {
        let Some(word) = own_word.get(run_id) else { continue };
        let merged_into = (error_code.as_deref() == Some("merged"))
            .then(|| error.as_deref()?.strip_prefix("merged into ").map(str::to_owned))
            .flatten()
            .map(|into| own_word.get(&into).cloned().unwrap_or(into));
        let entry = completions.entry(word.clone()).or_insert(Completion {
            run_id: word.clone(),
            count: 0,
            merged_into: None,
        });
        entry.count += usize::try_from(*count).unwrap();
        entry.merged_into = entry.merged_into.take().or(merged_into);
    }
    let mut checked_follows = Vec::new();
    for (run_id, seen) in follows {
        let stored: Vec<u64> = client
            .query("SELECT idx FROM run_events WHERE run_id = $1 ORDER BY idx", &[&run_id])
            .await
            .unwrap()
            .iter()
            .map(|row| u64::try_from(row.get::<_, i64>(0)).unwrap())
            .collect();
        checked_follows.push(Follow { run_id, seen, stored });
    }
    let history = History {
        cap: CAP,
        accepted,
        engines: engines_of(&cluster),
        completions: completions.into_values().collect(),
        polls: polls.lock().unwrap().clone(),
        down: cluster.down.clone(),
        follows: checked_follows,
    };
    let violations = history.check();
    // Each violation, with the engine intervals of the runs it names (ms from
    // the first engine's start).
    let origin = history.engines.iter().map(|span| span.start_ns).min().unwrap_or(0);
    let ms = |ns: u64| (ns.saturating_sub(origin) as f64 / 1e6).round();
    let by_node = cluster.engines_by_node();
    let mut report = violations
        .iter()
        .take(40)
        .map(|violation| {
            let named = format!("{violation:?}");
            let spans: Vec<String> = by_node
                .iter()
                .flat_map(|(node, spans)| spans.iter().map(move |span| (node, span)))
                .filter(|(_, span)| named.contains(&format!("\"{}\"", span.run_id)))
                .map(|(node, span)| {
                    let (start, end) = (ms(span.start_ns), span.end_ns.map(ms));
                    format!("{} on {node} {start}..{end:?}", span.run_id)
                })
                .collect();
            format!("{violation} [{}]", spans.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n");
    if !violations.is_empty() {
        let faults: Vec<String> =
            cluster.faults.iter().map(|(what, at)| format!("{what} at {}", ms(*at))).collect();
        report.push_str(&format!("\nfaults (ms from the first engine's start): {faults:?}"));
    }
    let interrupted = runs.iter().filter(|run| run.2.as_deref() == Some("interrupted")).count();
    let mut pollers: Vec<&str> = history.polls.iter().map(|poll| poll.node.as_str()).collect();
    pollers.dedup();
    // The figures of the run, read where the test's output is.
    #[allow(clippy::print_stderr)]
    {
        eprintln!(
            "cluster history: {} accepted, {} engine runs (at most {} at once), {interrupted} interrupted, \
             {} follows, polls by {pollers:?}, {cut} connections cut, fenced exit {fenced_exit:?}, \
             partitioned exit {partitioned_exit:?}, \
             settled {settled:?} after the faults, {:?} in all",
            history.accepted.len(),
            history.engines.len(),
            history.peak_engines(),
            history.follows.len(),
            began.elapsed()
        );
    }
    assert!(violations.is_empty(), "{} violations:\n{report}", violations.len());
    assert!(waited, "not every accepted message completed within 90 s of the faults healing");
    assert!(ended.is_ok(), "an engine process outlived the test's wait");
    assert!(cut > 0, "the node held no connection to terminate");
    assert_eq!(fenced_exit, Some(FENCED_EXIT), "the stopped node, fenced, exits with 75");
    assert_eq!(partitioned_exit, Some(FENCED_EXIT), "the partitioned node, fenced, exits with 75");
    assert_eq!(history.peak_engines(), CAP, "the load reached the cap");
    let mut polling: Vec<&str> = pollers.clone();
    polling.sort_unstable();
    polling.dedup();
    assert!(polling.len() >= 2, "the bot moved when its node was killed: {pollers:?}");
    drop(fake);
}
