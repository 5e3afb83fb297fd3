//! A small HTTP/1.1 client for load: thousands of connections from one
//! process, each from a loopback source address of the caller's choice, so one
//! machine plays many clients (every address in 127.0.0.0/8 is this machine).
//!
//! It writes requests by hand and reads responses with a `content-length`
//! body or a chunked one (event streams), keeping each connection open for
//! the next request. It checks what it reads and fails with the bytes it did
//! not understand; nothing here is meant for a hostile server.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

/// The longest response head read.
const MAX_HEAD: usize = 64 * 1024;

/// An open connection.
#[derive(Debug)]
pub struct Conn {
    stream: BufReader<TcpStream>,
    host: String,
}

/// A response read whole.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header names in lowercase.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// Whether the server will close the connection after this response.
    pub fn closes(&self) -> bool {
        self.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// A loopback address for client number `n` (127.1.x.y, never 127.0.0.1).
pub fn client_address(n: usize) -> Ipv4Addr {
    let n = u32::try_from(n % (1 << 16)).unwrap_or(0);
    Ipv4Addr::new(127, 1, (n >> 8) as u8, (n & 0xff) as u8)
}

impl Conn {
    /// Connects to `target` from `source` (any port).
    ///
    /// # Errors
    /// The socket's errors.
    pub async fn open(source: Ipv4Addr, target: SocketAddr) -> io::Result<Conn> {
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from((source, 0)))?;
        let stream = socket.connect(target).await?;
        stream.set_nodelay(true)?;
        Ok(Conn { stream: BufReader::new(stream), host: target.to_string() })
    }

    /// Sends one request (with `content-length` when it has a body).
    ///
    /// # Errors
    /// The socket's errors.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<()> {
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.host);
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            head.push_str(&format!("content-length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let stream = self.stream.get_mut();
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        Ok(())
    }

    /// Sends a request and reads its whole response.
    ///
    /// # Errors
    /// The socket's errors, or a response this client cannot read.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        self.send(method, path, headers, body).await?;
        let (status, headers) = self.read_head().await?;
        let body = if is_chunked(&headers) {
            let mut body = Vec::new();
            while let Some(chunk) = self.read_chunk().await? {
                body.extend_from_slice(&chunk);
            }
            body
        } else {
            let length = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .and_then(|(_, v)| v.parse::<usize>().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            self.stream.read_exact(&mut body).await?;
            body
        };
        Ok(Response { status, headers, body })
    }

    /// Sends a GET for an event stream and reads its head: the status and
    /// headers; the events follow with [`Conn::read_chunk`].
    ///
    /// # Errors
    /// As [`Conn::request`].
    pub async fn open_stream(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> io::Result<(u16, Vec<(String, String)>)> {
        self.send("GET", path, headers, b"").await?;
        self.read_head().await
    }

    /// The status line and headers of the next response.
    ///
    /// # Errors
    /// As [`Conn::request`].
    pub async fn read_head(&mut self) -> io::Result<(u16, Vec<(String, String)>)> {
        let mut read = 0;
        let mut line = String::new();
        if self.stream.read_line(&mut line).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before a response"));
        }
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| invalid(format!("not a status line: {line:?}")))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            let n = self.stream.read_line(&mut line).await?;
            read += n;
            if n == 0 || read > MAX_HEAD {
                return Err(invalid("the response head ended early or is too long".to_owned()));
            }
            let trimmed = line.trim_end();
            if trimmed.is_empty() {
                break;
            }
            let (name, value) = trimmed
                .split_once(':')
                .ok_or_else(|| invalid(format!("not a header: {trimmed:?}")))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        Ok((status, headers))
    }

    /// The next chunk of a chunked body; `None` after the last one.
    ///
    /// # Errors
    /// As [`Conn::request`].
    pub async fn read_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        let mut line = String::new();
        if self.stream.read_line(&mut line).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed inside a body"));
        }
        let size = line.trim_end().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| invalid(format!("not a chunk size: {line:?}")))?;
        let mut chunk = vec![0; size + 2];
        self.stream.read_exact(&mut chunk).await?;
        if !chunk.ends_with(b"\r\n") {
            return Err(invalid("a chunk does not end with CRLF".to_owned()));
        }
        chunk.truncate(size);
        if size == 0 {
            return Ok(None);
        }
        Ok(Some(chunk))
    }

    /// Waits until the server closes the connection, discarding what it sends.
    ///
    /// # Errors
    /// The socket's errors other than a reset.
    pub async fn closed(&mut self) -> io::Result<()> {
        let mut buffer = [0u8; 4096];
        loop {
            match self.stream.read(&mut buffer).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::ConnectionReset => return Ok(()),
                Err(error) => return Err(error),
            }
        }
    }
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Opens `count` connections to `target`, `per_client` from each client
/// address `first_client..` (see [`client_address`]), 500 at a time so the
/// listen backlog is never the limit.
///
/// # Errors
/// The first connection that could not be opened.
pub async fn open_many(
    target: SocketAddr,
    count: usize,
    first_client: usize,
    per_client: usize,
) -> io::Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(count);
    let indices: Vec<usize> = (0..count).collect();
    for batch in indices.chunks(500) {
        let opened =
            futures::future::join_all(batch.iter().map(|&i| {
                Conn::open(client_address(first_client + i / per_client.max(1)), target)
            }))
            .await;
        for conn in opened {
            conns.push(conn?);
        }
    }
    Ok(conns)
}

/// Resident memory of process `pid` in bytes (`VmRSS`), and its peak (`VmHWM`).
///
/// # Errors
/// When `/proc/<pid>/status` cannot be read or lacks the fields.
pub fn memory(pid: u32) -> io::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> io::Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .ok_or_else(|| invalid(format!("no {name} in /proc/{pid}/status")))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Open descriptors of process `pid`.
///
/// # Errors
/// When `/proc/<pid>/fd` cannot be read.
pub fn open_descriptors(pid: u32) -> io::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// Raises this process's descriptor limit to `want` (the hard limit too,
/// which needs root); the soft limit in force after.
pub fn raise_descriptor_limit(want: u64) -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 1024 };
    if soft >= want {
        return soft;
    }
    if setrlimit(Resource::RLIMIT_NOFILE, want, want.max(hard)).is_ok() {
        return want;
    }
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    getrlimit(Resource::RLIMIT_NOFILE).map_or(soft, |(soft, _)| soft)
}

/// The gateway a soak talks to.
#[derive(Debug, Clone)]
pub struct SoakTarget {
    pub api: SocketAddr,
    pub hook: SocketAddr,
    pub pid: u32,
    pub api_token: String,
    pub hook_token: String,
    /// A webhook integration in async mode that takes `session_key`.
    pub async_integration: String,
    /// A webhook integration in sync mode.
    pub sync_integration: String,
}

/// What a soak did and measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SoakReport {
    pub seconds: f64,
    /// Requests that started a run (a duplicate delivery counts once).
    pub runs: u64,
    pub runs_per_second: f64,
    pub api_runs_followed: u64,
    pub webhook_async: u64,
    pub webhook_sync: u64,
    pub idempotent_duplicates: u64,
    pub cancelled: u64,
    pub reconnects: u64,
    pub gateway_cpu_per_run_us: f64,
    pub rss_mb_middle: f64,
    pub rss_mb_late: f64,
    pub rss_mb_high_water: f64,
    pub descriptors_middle: usize,
    pub descriptors_max_late: usize,
    /// The last fifth's median RSS within 10 % (and 8 MB) of the middle
    /// fifth's, and the last fifth's descriptors within 16 of the middle's:
    /// the first two fifths are the warm-up, in which the store's page
    /// caches (32 MB a connection) fill.
    pub flat: bool,
    /// `[seconds, RSS MB, descriptors]` every sample.
    pub samples: Vec<(f64, f64, usize)>,
}

#[derive(Debug, Default)]
struct Traffic {
    api_runs: AtomicU64,
    webhook_async: AtomicU64,
    webhook_sync: AtomicU64,
    duplicates: AtomicU64,
    cancels: AtomicU64,
    reconnects: AtomicU64,
}

impl Traffic {
    fn runs(&self) -> u64 {
        [&self.api_runs, &self.webhook_async, &self.webhook_sync, &self.duplicates, &self.cancels]
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// Bytes in megabytes, to one decimal.
pub fn mb(bytes: u64) -> f64 {
    (bytes as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

/// A request that must be answered with one of `statuses`.
async fn expect(
    conn: &mut Conn,
    path: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
    statuses: &[u16],
) -> anyhow::Result<Response> {
    let response = conn.request("POST", path, headers, body.to_string().as_bytes()).await?;
    anyhow::ensure!(
        statuses.contains(&response.status),
        "POST {path} answered {}: {}",
        response.status,
        String::from_utf8_lossy(&response.body)
    );
    Ok(response)
}

/// One soak client: a loop over the kinds of traffic a gateway sees, each
/// waited for, on connections it replaces now and then.
async fn soak_worker(
    worker: usize,
    target: SoakTarget,
    traffic: Arc<Traffic>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let auth = format!("Bearer {}", target.api_token);
    let hook_auth = format!("Bearer {}", target.hook_token);
    let api = [("authorization", auth.as_str()), ("content-type", "application/json")];
    let hook = [("authorization", hook_auth.as_str()), ("content-type", "application/json")];
    let async_path = format!("/webhooks/{}", target.async_integration);
    let sync_path = format!("/webhooks/{}", target.sync_integration);
    let source = client_address(worker);
    let mut api_conn = Conn::open(source, target.api).await?;
    let mut stream_conn = Conn::open(source, target.api).await?;
    let mut hook_conn = Conn::open(source, target.hook).await?;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let session = format!("soak:{worker}:{}", n % 50);
        match n % 8 {
            // A run over the API, followed on its event stream to the end.
            0..=2 => {
                let body = serde_json::json!({ "prompt": format!("soak {worker} {n}"), "session_key": session });
                let response = expect(&mut api_conn, "/v1/runs", &api, &body, &[202]).await?;
                let run_id = response.json()["run_id"].as_str().unwrap_or_default().to_owned();
                let path = format!("/v1/runs/{run_id}/events");
                let (status, _) = stream_conn.open_stream(&path, &api[..1]).await?;
                anyhow::ensure!(status == 200, "the stream of {run_id} answered {status}");
                while stream_conn.read_chunk().await?.is_some() {}
                traffic.api_runs.fetch_add(1, Ordering::Relaxed);
            }
            // Webhook runs, answered later.
            3 | 4 => {
                let body = serde_json::json!({ "prompt": format!("hook {worker} {n}"), "session_key": session });
                expect(&mut hook_conn, &async_path, &hook, &body, &[202]).await?;
                traffic.webhook_async.fetch_add(1, Ordering::Relaxed);
            }
            // A sync webhook, answered in its response.
            5 => {
                let body = serde_json::json!({ "prompt": format!("sync {worker} {n}") });
                expect(&mut hook_conn, &sync_path, &hook, &body, &[200]).await?;
                traffic.webhook_sync.fetch_add(1, Ordering::Relaxed);
            }
            // The same delivery twice (a sender's retry): one run.
            6 => {
                let key = format!("soak-{worker}-{n}");
                let body = serde_json::json!({ "prompt": format!("once {worker} {n}") });
                let headers = [hook[0], hook[1], ("idempotency-key", key.as_str())];
                let first = expect(&mut hook_conn, &async_path, &headers, &body, &[202]).await?;
                let again =
                    expect(&mut hook_conn, &async_path, &headers, &body, &[200, 202]).await?;
                anyhow::ensure!(
                    first.json()["run_id"] == again.json()["run_id"],
                    "a duplicate delivery started another run: {} then {}",
                    first.json(),
                    again.json()
                );
                traffic.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            // A run cancelled at once; now and then, fresh connections.
            _ => {
                let body = serde_json::json!({ "prompt": format!("cancel {worker} {n}"), "session_key": session });
                let response = expect(&mut api_conn, "/v1/runs", &api, &body, &[202]).await?;
                let run_id = response.json()["run_id"].as_str().unwrap_or_default().to_owned();
                let path = format!("/v1/runs/{run_id}/cancel");
                let response = api_conn.request("POST", &path, &api[..1], b"").await?;
                anyhow::ensure!(
                    matches!(response.status, 200 | 202 | 409),
                    "cancel answered {}",
                    response.status
                );
                traffic.cancels.fetch_add(1, Ordering::Relaxed);
                if n % 64 == 7 {
                    api_conn = Conn::open(source, target.api).await?;
                    stream_conn = Conn::open(source, target.api).await?;
                    hook_conn = Conn::open(source, target.hook).await?;
                    traffic.reconnects.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    Ok(())
}

/// `duration` of traffic from 32 closed-loop clients (API runs followed to
/// their end, async and sync webhooks, duplicate deliveries, cancels,
/// reconnects), sampling the gateway's memory and descriptors 30 times;
/// `progress` gets a line per sample.
///
/// # Errors
/// A request answered otherwise than a healthy gateway answers, or `/proc`
/// unreadable.
pub async fn soak(
    target: &SoakTarget,
    duration: Duration,
    mut progress: impl FnMut(String),
) -> anyhow::Result<SoakReport> {
    const WORKERS: usize = 32;
    let traffic = Arc::new(Traffic::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let task = soak_worker(worker, target.clone(), traffic.clone(), stop.clone());
        workers.push(tokio::spawn(task));
    }
    let every = (duration / 30).max(Duration::from_millis(200));
    let began = Instant::now();
    let pid = target.pid;
    let cpu_before = cpu_time(pid)?;
    let mut samples: Vec<(f64, u64, usize)> = Vec::new();
    while began.elapsed() < duration && !workers.iter().any(tokio::task::JoinHandle::is_finished) {
        tokio::time::sleep(every).await;
        let (rss, _) = memory(pid)?;
        let fds = open_descriptors(pid)?;
        samples.push((began.elapsed().as_secs_f64(), rss, fds));
        progress(format!(
            "soak {:>6.0} s: {:>9} runs, RSS {:>7.1} MB, {fds} descriptors",
            began.elapsed().as_secs_f64(),
            traffic.runs(),
            mb(rss),
        ));
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await??;
    }
    let seconds = began.elapsed().as_secs_f64();
    let cpu = cpu_time(pid)?.saturating_sub(cpu_before);
    let (_, hwm) = memory(pid)?;
    anyhow::ensure!(samples.len() >= 5, "too few samples ({}) to judge", samples.len());
    let fifth = samples.len() / 5;
    let median_rss = |slice: &[(f64, u64, usize)]| {
        let mut rss: Vec<u64> = slice.iter().map(|s| s.1).collect();
        rss.sort_unstable();
        rss[rss.len() / 2]
    };
    let middle_samples = &samples[2 * fifth..3 * fifth];
    let late_samples = &samples[samples.len() - fifth..];
    let middle = median_rss(middle_samples);
    let late = median_rss(late_samples);
    let descriptors_middle = middle_samples.iter().map(|s| s.2).max().unwrap_or(0);
    let descriptors_max_late = late_samples.iter().map(|s| s.2).max().unwrap_or(0);
    let flat = late <= middle + middle / 10 + 8 * 1024 * 1024
        && descriptors_max_late <= descriptors_middle + 16;
    let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let runs = traffic.runs();
    Ok(SoakReport {
        seconds: seconds.round(),
        runs,
        runs_per_second: (runs as f64 / seconds).round(),
        api_runs_followed: count(&traffic.api_runs),
        webhook_async: count(&traffic.webhook_async),
        webhook_sync: count(&traffic.webhook_sync),
        idempotent_duplicates: count(&traffic.duplicates),
        cancelled: count(&traffic.cancels),
        reconnects: count(&traffic.reconnects),
        gateway_cpu_per_run_us: (cpu.as_secs_f64() * 1e6 / runs.max(1) as f64).round(),
        rss_mb_middle: mb(middle),
        rss_mb_late: mb(late),
        rss_mb_high_water: mb(hwm),
        descriptors_middle,
        descriptors_max_late,
        flat,
        samples: samples
            .iter()
            .map(|&(t, rss, fds)| ((t * 10.0).round() / 10.0, mb(rss), fds))
            .collect(),
    })
}

/// How many times the threads of process `pid` have blocked so far (the sum
/// of `voluntary_ctxt_switches` over `/proc/<pid>/task`): each is a sleep and
/// a wake-up, the scheduler's share of a request's cost.
///
/// # Errors
/// When the process's task list cannot be read.
pub fn voluntary_switches(pid: u32) -> io::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        // A thread that ended meanwhile takes its count with it.
        let Ok(status) = std::fs::read_to_string(task?.path().join("status")) else { continue };
        total += status
            .lines()
            .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    Ok(total)
}

/// User and system CPU time of process `pid` so far.
///
/// # Errors
/// When `/proc/<pid>/stat` cannot be read.
pub fn cpu_time(pid: u32) -> io::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rfind(')').map(|i| &stat[i + 1..]).unwrap_or_default();
    // After the command: utime and stime are the 12th and 13th fields.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> io::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| invalid(format!("short /proc/{pid}/stat")))
    };
    // In USER_HZ, which the kernel's ABI fixes at 100 a second.
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}
