//! One bridge process at a time: started through the [`Launcher`] the server
//! gives (only the engines' process module spawns), told `ready`, read line by
//! line, pinged while quiet, and ended (killed with its process group) when it
//! exits, stops answering, or the gateway stops.
//!
//! [`Link`] is what the outbox's sink shares with the running bridge: the
//! writer of the bridge that is ready (none between bridges) and the sends
//! waiting for their `sent` or `error`. A bridge that ends fails every send
//! still waiting, so the outbox sends it again to the next one.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::log_text;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::protocol::{self, FromBridge, InboundMessage, Line, LineReader, ToBridge};

/// How to start the bridge.
#[derive(Clone)]
pub struct BridgeCommand {
    /// `node` (looked up on the `PATH` of `env`) or a path.
    pub program: String,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// Its whole environment; the wallet key is here, never in `args`.
    pub env: BTreeMap<String, String>,
}

impl fmt::Debug for BridgeCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BridgeCommand")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("cwd", &self.cwd)
            .field("env_keys", &self.env.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// A started bridge: its pipes and the child.
pub struct BridgeProcess {
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
    pub stdout: Pin<Box<dyn AsyncRead + Send>>,
    pub stderr: Pin<Box<dyn AsyncRead + Send>>,
    pub child: Box<dyn BridgeChild>,
}

impl fmt::Debug for BridgeProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BridgeProcess").field("child", &self.child).finish_non_exhaustive()
    }
}

/// The bridge's process. Dropping it kills its process group.
#[async_trait]
pub trait BridgeChild: Send + fmt::Debug {
    /// Waits for it to exit: how it ended (`exit code 1`). Cancel safe.
    async fn wait(&mut self) -> String;
    /// Asks it to stop, kills it after `grace`: how it ended.
    async fn stop(&mut self, grace: Duration) -> String;
}

/// Starts bridges.
#[async_trait]
pub trait Launcher: Send + Sync + fmt::Debug + 'static {
    /// Starts `command` in its own process group.
    ///
    /// # Errors
    /// Why it could not be started (the program not found…), without secrets.
    async fn launch(&self, command: BridgeCommand) -> Result<BridgeProcess, String>;
}

/// Why a send did not go out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// No bridge was ready in time, or it ended before it answered.
    #[error("the XMTP bridge is not running ({0})")]
    BridgeDown(String),
    /// The bridge did not answer in time.
    #[error("the XMTP bridge did not answer the send in time")]
    Timeout,
    /// The bridge reported a failure.
    #[error("the XMTP bridge could not send: {message}")]
    Failed { message: String, retry: bool },
}

/// The running bridge as senders see it.
#[derive(Debug)]
pub struct Link {
    writer: watch::Sender<Option<mpsc::Sender<String>>>,
    pending: Mutex<HashMap<String, oneshot::Sender<Result<String, SendError>>>>,
    timeout: Duration,
}

impl Link {
    pub fn new(timeout: Duration) -> Self {
        Link { writer: watch::Sender::new(None), pending: Mutex::default(), timeout }
    }

    /// Sends `text` to `conversation_id` through the bridge: waits (up to the
    /// send timeout) for a ready bridge, then for its answer. The message id.
    ///
    /// # Errors
    /// [`SendError`]: no bridge, no answer, or the bridge's own error.
    ///
    /// # Cancel safety
    /// Cancel safe; the bridge may still send.
    pub async fn send(
        &self,
        request_id: &str,
        conversation_id: &str,
        text: &str,
    ) -> Result<String, SendError> {
        let mut ready = self.writer.subscribe();
        let writer = tokio::time::timeout(self.timeout, ready.wait_for(Option::is_some))
            .await
            .map_err(|_| SendError::BridgeDown("none became ready".into()))?
            .map_err(|_| SendError::BridgeDown("stopped".into()))?
            .clone();
        let Some(writer) = writer else { return Err(SendError::BridgeDown("stopped".into())) };
        let (reply, answer) = oneshot::channel();
        self.pending().insert(request_id.to_owned(), reply);
        let line = ToBridge::Send {
            request_id: request_id.to_owned(),
            conversation_id: conversation_id.to_owned(),
            text: text.to_owned(),
        }
        .to_line();
        if writer.send(line).await.is_err() {
            self.pending().remove(request_id);
            return Err(SendError::BridgeDown("it ended".into()));
        }
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(SendError::BridgeDown("it ended".into())),
            Err(_) => {
                self.pending().remove(request_id);
                Err(SendError::Timeout)
            }
        }
    }

    fn pending(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<Result<String, SendError>>>>
    {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn answer(&self, request_id: &str, result: Result<String, SendError>) {
        match self.pending().remove(request_id) {
            Some(reply) => {
                let _ = reply.send(result);
            }
            None => {
                tracing::debug!(request_id = %log_text::escape(request_id), "an answer to no send waiting")
            }
        }
    }

    /// Acks message `id` to the running bridge, if one is (best effort: a
    /// bridge that hands it over again gets it deduplicated by its run id).
    pub fn ack(&self, id: &str) {
        if let Some(writer) = self.writer.borrow().as_ref() {
            let _ = writer.try_send(ToBridge::Ack { id: id.to_owned() }.to_line());
        }
    }

    fn connect(&self, writer: mpsc::Sender<String>) {
        self.writer.send_replace(Some(writer));
    }

    /// The bridge ended: no writer, and every waiting send fails.
    fn disconnect(&self, why: &str) {
        self.writer.send_replace(None);
        for (_, reply) in self.pending().drain() {
            let _ = reply.send(Err(SendError::BridgeDown(why.to_owned())));
        }
    }
}

/// What one bridge's life told the transport.
#[async_trait]
pub trait BridgeEvents: Send + Sync {
    /// The bridge is ready as `inbox_id` (`address`).
    async fn ready(&self, inbox_id: &str, address: Option<&str>);
    /// A message came in; `true` once it is taken (then it is acked).
    async fn message(&self, message: InboundMessage) -> bool;
}

/// How one bridge ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The gateway is stopping.
    Stopped,
    /// It failed, after saying `ready` or not.
    Failed { reason: String, was_ready: bool },
}

/// Timings of one bridge's life.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    pub ready_timeout: Duration,
    pub ping_interval: Duration,
    pub ping_timeout: Duration,
}

/// Runs one bridge from its start to its end.
pub async fn run_once(
    launcher: &dyn Launcher,
    command: BridgeCommand,
    timings: Timings,
    link: &Link,
    events: &dyn BridgeEvents,
    stop: &CancellationToken,
    tracker: &TaskTracker,
) -> Ended {
    let process = tokio::select! {
        () = stop.cancelled() => return Ended::Stopped,
        launched = launcher.launch(command) => match launched {
            Ok(process) => process,
            Err(reason) => {
                return Ended::Failed { reason: format!("could not start the bridge: {reason}"), was_ready: false }
            }
        },
    };
    let BridgeProcess { stdin, stdout, stderr, mut child } = process;
    let (lines_tx, lines_rx) = mpsc::channel::<String>(64);
    let writer_stop = CancellationToken::new();
    let _stop_writer = writer_stop.clone().drop_guard();
    tracker.spawn(write_lines(stdin, lines_rx, writer_stop.clone()));
    tracker.spawn(log_stderr(stderr, writer_stop));
    let mut reader = LineReader::new(BufReader::new(stdout), protocol::MAX_LINE_BYTES);

    let mut ready = false;
    let ready_by = Instant::now() + timings.ready_timeout;
    let mut next_ping = Instant::now() + timings.ping_interval;
    let mut ping_out: Option<String> = None;
    let mut n_pings: u64 = 0;
    let ended = loop {
        let deadline = if ready { next_ping } else { ready_by };
        tokio::select! {
            // Lines before the exit, so what the bridge said last is read.
            biased;
            () = stop.cancelled() => {
                link.disconnect("the gateway is stopping");
                child.stop(Duration::from_secs(2)).await;
                return Ended::Stopped;
            }
            () = tokio::time::sleep_until(deadline) => {
                if !ready {
                    child.stop(Duration::from_secs(2)).await;
                    break format!("the bridge was not ready within {} ms", timings.ready_timeout.as_millis());
                }
                if ping_out.is_some() {
                    child.stop(Duration::from_secs(2)).await;
                    break format!("the bridge stopped answering (no pong within {} ms)", timings.ping_timeout.as_millis());
                }
                n_pings += 1;
                let id = n_pings.to_string();
                let _ = lines_tx.try_send(ToBridge::Ping { id: id.clone() }.to_line());
                ping_out = Some(id);
                next_ping = Instant::now() + timings.ping_timeout;
            }
            line = reader.next_line() => {
                let text = match line {
                    Ok(Some(Line::Text(text))) => text,
                    Ok(Some(Line::Oversized(bytes))) => {
                        tracing::warn!(bytes, "a line from the XMTP bridge over the limit; skipped");
                        continue;
                    }
                    Ok(None) | Err(_) => {
                        // Its stdout closed: it is exiting (or must).
                        let exit = match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
                            Ok(exit) => exit,
                            Err(_) => child.stop(Duration::from_secs(1)).await,
                        };
                        break format!("the bridge exited ({exit})");
                    }
                };
                if text.trim().is_empty() {
                    continue;
                }
                match protocol::parse_line(&text) {
                    Ok(FromBridge::Ready { inbox_id, address }) => {
                        ready = true;
                        next_ping = Instant::now() + timings.ping_interval;
                        link.connect(lines_tx.clone());
                        events.ready(&inbox_id, address.as_deref()).await;
                    }
                    Ok(FromBridge::Message(message)) => {
                        let id = message.id.clone();
                        if events.message(message).await {
                            let _ = lines_tx.send(ToBridge::Ack { id }.to_line()).await;
                        }
                    }
                    Ok(FromBridge::Sent { request_id, message_id }) => {
                        link.answer(&request_id, Ok(message_id));
                    }
                    Ok(FromBridge::Error { request_id: Some(request_id), message, retry }) => {
                        link.answer(&request_id, Err(SendError::Failed { message, retry }));
                    }
                    Ok(FromBridge::Error { request_id: None, message, .. }) => {
                        tracing::warn!(error = %log_text::escape(&message), "the XMTP bridge reports");
                    }
                    Ok(FromBridge::Pong { id }) => {
                        if ping_out.as_deref() == Some(id.as_str()) {
                            ping_out = None;
                            next_ping = Instant::now() + timings.ping_interval;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "a line from the XMTP bridge skipped");
                    }
                }
            }
            exit = child.wait() => break format!("the bridge exited ({exit})"),
        }
    };
    link.disconnect(&ended);
    Ended::Failed { reason: ended, was_ready: ready }
}

async fn write_lines(
    mut stdin: Pin<Box<dyn AsyncWrite + Send>>,
    mut lines: mpsc::Receiver<String>,
    stop: CancellationToken,
) {
    loop {
        let line = tokio::select! {
            () = stop.cancelled() => return,
            line = lines.recv() => line,
        };
        let Some(mut line) = line else { return };
        line.push('\n');
        let written = tokio::select! {
            () = stop.cancelled() => return,
            written = async {
                stdin.write_all(line.as_bytes()).await?;
                stdin.flush().await
            } => written,
        };
        if written.is_err() {
            return;
        }
    }
}

/// The bridge's stderr, line by line into the log (escaped, bounded).
async fn log_stderr(stderr: Pin<Box<dyn AsyncRead + Send>>, stop: CancellationToken) {
    let mut reader = LineReader::new(BufReader::new(stderr), 4096);
    loop {
        let line = tokio::select! {
            () = stop.cancelled() => return,
            line = reader.next_line() => line,
        };
        match line {
            Ok(Some(Line::Text(text))) => {
                tracing::info!(line = %log_text::escape(&text), "xmtp bridge");
            }
            Ok(Some(Line::Oversized(_))) => {}
            Ok(None) | Err(_) => return,
        }
    }
}
