//! One run of a vendor CLI: start it, then supervise it until it is gone.
//!
//! The supervisor is a task (on the engine's tracker) that owns the child, its pipes
//! and the run's [`Translator`]. It reads stdout and stderr as they come, resets the
//! inactivity timer on any output, writes steering messages to stdin, and ends the
//! run exactly one way:
//! - **the stream completes** (a terminal event): stdin is closed and the CLI gets
//!   `cancel_grace` to exit before it is terminated;
//! - **the process exits**: whatever it left in its process group is killed and the
//!   pipes are read to their end (for at most `cancel_grace`), so late lines count,
//!   then the exit decides the completion;
//! - **inactivity timeout**: the group is killed, the run fails with `timeout`;
//! - **cancel** (or gateway shutdown, or the run no longer listening): SIGTERM to
//!   the group, SIGKILL after `cancel_grace`; no `Completed` is sent, the gateway
//!   completes a cancelled run itself.
//!
//! In every case the leader is reaped and the group killed before the run's last
//! event is sent, so a `Completed` (or the sink closing) means no process is left.
//! A cancelled run sends nothing; its [`RunControl::stopped`] resolves once the
//! supervisor has reaped the group, and the gateway completes it only then.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lemon_core::engine::{
    EngineError, EngineEvent, EventSink, RunControl, StartRequest, SteerError,
};
use lemon_core::ids::RunId;
use tokio::process::{ChildStderr, ChildStdout};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use super::link::GateLink;
use super::process::{
    self, CliChild, Exit, LineReader, ProcessRecorder, ProcessSpec, StderrTail, StdinHandle,
    StdoutLine,
};
use super::settings::{self, CliSettings};
use super::translate::{ParseContext, StreamParser, Translator};
use super::{claude, codex, droid, opencode, pi, CommandInput, Invocation, Vendor};

/// Everything an engine hands over to start one run.
#[derive(Debug)]
pub(crate) struct Launch {
    pub(crate) vendor: Vendor,
    pub(crate) program: PathBuf,
    pub(crate) settings: Arc<CliSettings>,
    pub(crate) base_env: Arc<BTreeMap<String, String>>,
    pub(crate) api_key: Option<String>,
    pub(crate) tracker: TaskTracker,
    /// Cancels this run; a child of the gateway's shutdown token.
    pub(crate) cancel: CancellationToken,
    /// Keeps the record of the run's process group, when the app keeps one.
    pub(crate) recorder: Option<Arc<dyn ProcessRecorder>>,
    /// `--max-budget-usd` for the CLIs that take it.
    pub(crate) max_budget_usd: Option<f64>,
    /// Where the CLI asks about its calls and finds the gateway's tools.
    pub(crate) gate: Option<lemon_core::approvals::Gate>,
}

/// Spawns the CLI, records its process group, and starts its supervisor.
///
/// # Errors
/// [`EngineError::Start`] when the process could not be started; nothing was sent.
pub(crate) async fn start(
    launch: Launch,
    req: StartRequest,
    sink: EventSink,
) -> Result<Arc<dyn RunControl>, EngineError> {
    let Launch {
        vendor,
        program,
        settings,
        base_env,
        api_key,
        tracker,
        cancel,
        recorder,
        max_budget_usd,
        gate,
    } = launch;
    // A token of another engine cannot be continued here: the run is a new session.
    let resume = req.resume.clone().filter(|token| token.engine == vendor.id());
    // Outside text reaches the CLI's model inside a data block, as the native engine's.
    let prompt = lemon_core::untrusted::prompt_for_model(&req.prompt, &req.meta);
    let scope = lemon_core::approvals::RunScope {
        untrusted: lemon_core::untrusted::source(&req.meta).is_some(),
        engine: vendor.id(),
        cwd: &req.cwd,
        meta: &req.meta,
    };
    let link = match &gate {
        Some(gate) => {
            GateLink::open(gate, vendor, &settings, &scope, &req, &sink).map_err(|err| {
                EngineError::Start(format!(
                    "cannot point {vendor} at the gateway's MCP endpoint: {err}"
                ))
            })?
        }
        None => None,
    };
    let relayed = link.as_ref().is_some_and(GateLink::relayed);
    let input = CommandInput {
        settings: &settings,
        prompt: &prompt,
        resume: resume.as_ref().map(|token| token.value.as_str()),
        model: req.model.as_deref(),
        cwd: &req.cwd,
        base_env: &base_env,
        max_budget_usd,
        gateway_mcp: link.as_ref().and_then(GateLink::access),
    };
    let invocation = match vendor {
        Vendor::Claude => claude::command(&input),
        Vendor::Codex if relayed => codex::app_server::command(&input),
        Vendor::Codex => codex::command(&input),
        Vendor::Opencode if relayed => opencode::serve::command(&input),
        Vendor::Opencode => opencode::command(&input),
        Vendor::Pi => pi::command(&input),
        Vendor::Droid => droid::command(&input),
    };
    let ctx = ParseContext {
        cwd: Some(req.cwd.clone()),
        home: base_env.get("HOME").cloned(),
        model: invocation.model.clone(),
        provider: settings.provider.clone(),
    };
    let parser = parser(vendor, ctx, invocation.new_session.clone(), resume.is_some());
    let model = invocation.model.clone();
    let mut env = settings::child_env(&base_env, &invocation.env, &settings, api_key.as_deref());
    if let Some(access) = link.as_ref().and_then(GateLink::access) {
        access.add_env(&mut env);
    }
    // OpenCode's server answers only whoever holds this run's password.
    let password = (relayed && vendor == Vendor::Opencode).then(opencode::serve::password);
    if let Some(password) = &password {
        env.insert(opencode::serve::PASSWORD_ENV.to_owned(), password.clone());
    }
    let Invocation { args, stdin, prompt_is_last_arg, .. } = invocation;
    let spec = ProcessSpec {
        program,
        args,
        cwd: req.cwd.clone(),
        env,
        stdin,
        prompt_is_last_arg,
        landlock: None,
    };
    let spawned = process::spawn(spec, settings.max_line_bytes, &tracker).await.map_err(|err| {
        let error = lemon_core::log_text::escape(&err.to_string());
        tracing::warn!(run_id = %req.run_id, engine = vendor.id(), %error, "cli process did not start");
        EngineError::Start(err.to_string())
    })?;
    tracing::info!(run_id = %req.run_id, engine = vendor.id(), pgid = spawned.child.pgid(), relayed, "cli run started");
    // Recorded before the run sees any event, so a gateway killed from then on
    // leaves the group for the next start to kill.
    let recorder = recorder.filter(|_| spawned.group.is_some());
    if let (Some(recorder), Some(group)) = (&recorder, spawned.group) {
        recorder.started(group).await;
    }

    let process::Spawned { child, stdout, stderr, stdin, .. } = spawned;
    // A relayed run's client owns the server's pipes and hands the supervisor
    // the lines the CLI's own stream would have printed.
    let (stdout, stdin) = match link.as_ref().filter(|_| relayed) {
        Some(relay) => {
            let (lines, driven) = mpsc::channel(64);
            let asker = relay.asker();
            let resume = resume.as_ref().map(|token| token.value.clone());
            if vendor == Vendor::Codex {
                let prompt = prompt.into_owned();
                let turn = codex::app_server::Turn { prompt, model, cwd: req.cwd.clone(), resume };
                tracker.spawn(codex::app_server::drive(stdout, stdin, lines, asker, turn));
            } else {
                let session = opencode::serve::Session {
                    prompt: prompt.into_owned(),
                    model,
                    resume,
                    password: password.unwrap_or_default(),
                };
                tracker.spawn(opencode::serve::drive(stdout, lines, asker, session));
            }
            (Output::Driven(driven), None)
        }
        None => (Output::Pipe(stdout), stdin),
    };
    let (steer_tx, steer_rx) = match &stdin {
        Some(_) => {
            let (tx, rx) = mpsc::channel(8);
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let stopped = CancellationToken::new();
    let supervisor = Supervisor {
        run_id: req.run_id,
        vendor,
        child,
        stdout,
        stderr,
        stdin,
        steer_rx,
        server: relayed && vendor == Vendor::Opencode,
        translator: Translator::new(vendor, parser, resume),
        sink,
        cancel: cancel.clone(),
        timeout: settings.timeout,
        grace: settings.cancel_grace,
        max_line_bytes: settings.max_line_bytes,
        recorder,
        link,
        _stopped: stopped.clone().drop_guard(),
    };
    tracker.spawn(supervisor.run());
    Ok(Arc::new(CliControl { cancel, steer: steer_tx, stopped }))
}

/// Asks the gate about one run's calls, for the client of a CLI's server.
#[derive(Debug, Clone)]
pub(crate) struct Asker {
    gate: lemon_core::approvals::Gate,
    token: String,
}

impl Asker {
    /// Asks `gate` as the run registered with `token`.
    pub(crate) fn new(gate: lemon_core::approvals::Gate, token: String) -> Asker {
        Asker { gate, token }
    }

    /// The gate's decision on `tool` called with `input`; a run that is over
    /// (its token withdrawn) runs nothing more.
    pub(crate) async fn decide(
        &self,
        tool: &str,
        input: &serde_json::Value,
        call_id: Option<&str>,
    ) -> lemon_core::approvals::Decision {
        self.gate
            .decide(&self.token, tool, input, call_id)
            .await
            .unwrap_or_else(|_| lemon_core::approvals::Decision::Deny("the run is over".to_owned()))
    }
}

/// Where the supervisor reads the CLI's stream from.
#[derive(Debug)]
enum Output {
    /// The CLI's stdout.
    Pipe(LineReader<ChildStdout>),
    /// The lines a relayed CLI's client makes of its server's messages.
    Driven(mpsc::Receiver<StdoutLine>),
}

impl Output {
    async fn next_line(&mut self) -> std::io::Result<Option<StdoutLine>> {
        match self {
            Output::Pipe(reader) => reader.next_line().await,
            Output::Driven(lines) => Ok(lines.recv().await),
        }
    }
}

/// `vendor`'s stream parser; `new_session` is pi's new session file, `resumed`
/// whether the run continues a session.
pub(crate) fn parser(
    vendor: Vendor,
    ctx: ParseContext,
    new_session: Option<String>,
    resumed: bool,
) -> Box<dyn StreamParser> {
    match vendor {
        Vendor::Claude => Box::new(claude::Parser::new(ctx)),
        Vendor::Codex => Box::new(codex::Parser::new(ctx)),
        Vendor::Opencode => Box::new(opencode::Parser::new(ctx)),
        Vendor::Pi => Box::new(pi::Parser::new(ctx, new_session, resumed)),
        Vendor::Droid => Box::new(droid::Parser::new(ctx)),
    }
}

/// A steering message on its way to the supervisor.
#[derive(Debug)]
struct SteerRequest {
    text: String,
    reply: oneshot::Sender<Result<(), SteerError>>,
}

/// The handle the gateway holds: cancel always, steer when stdin is kept open.
#[derive(Debug)]
struct CliControl {
    cancel: CancellationToken,
    steer: Option<mpsc::Sender<SteerRequest>>,
    /// Cancelled when the supervisor is gone: the process group is reaped.
    stopped: CancellationToken,
}

#[async_trait]
impl RunControl for CliControl {
    fn cancel(&self) {
        self.cancel.cancel();
    }

    async fn stopped(&self) {
        self.stopped.cancelled().await;
    }

    async fn steer(&self, text: &str) -> Result<(), SteerError> {
        let Some(tx) = &self.steer else { return Err(SteerError::Unsupported) };
        let (reply, rx) = oneshot::channel();
        tx.send(SteerRequest { text: text.to_owned(), reply })
            .await
            .map_err(|_| SteerError::Finished)?;
        rx.await.map_err(|_| SteerError::Finished)?
    }
}

/// Why supervision stopped without completing the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Cancelled,
    /// The run stopped listening.
    SinkClosed,
}

/// Owns one run's child, pipes and translation until the child is gone.
#[derive(Debug)]
struct Supervisor {
    run_id: RunId,
    vendor: Vendor,
    /// The leader; reaped before the supervisor ends, or SIGKILLed (with its group) on drop.
    child: CliChild,
    stdout: Output,
    stderr: StderrTail<ChildStderr>,
    /// Kept-open stdin (steering); dropped when the stream completes, which closes it.
    stdin: Option<StdinHandle>,
    /// Steering requests from the [`CliControl`]; `None` once its senders are gone.
    steer_rx: Option<mpsc::Receiver<SteerRequest>>,
    /// The CLI is a server that never exits by itself: it is terminated as
    /// soon as the run's stream completes.
    server: bool,
    translator: Translator,
    sink: EventSink,
    cancel: CancellationToken,
    timeout: Option<Duration>,
    grace: Duration,
    max_line_bytes: usize,
    /// Told when the group is reaped; `None` when nothing was recorded.
    recorder: Option<Arc<dyn ProcessRecorder>>,
    /// The run's registration with the gate (its token, and the MCP
    /// configuration that holds it), held as long as the process.
    link: Option<GateLink>,
    /// Fires [`CliControl::stopped`] when the supervisor is gone; declared after
    /// `child`, so a child dropped unreaped is killed first.
    _stopped: DropGuard,
}

impl Supervisor {
    async fn run(mut self) {
        match self.supervise().await {
            Ok(()) => {
                tracing::debug!(run_id = %self.run_id, engine = self.vendor.id(), "cli run finished")
            }
            Err(stop) => {
                let exit = self.child.terminate(self.grace).await;
                tracing::info!(run_id = %self.run_id, engine = self.vendor.id(), ?stop, ?exit, "cli run stopped");
            }
        }
        if let Some(recorder) = &self.recorder {
            recorder.reaped(self.child.pgid()).await;
        }
    }

    async fn supervise(&mut self) -> Result<(), Stop> {
        // The run's `Completed`, held until the process is gone.
        let mut held: Option<EngineEvent> = None;
        let mut exit: Option<Exit> = None;
        let mut stdout_open = true;
        let mut stderr_open = true;
        let mut idle_deadline = self.timeout.map(|timeout| Instant::now() + timeout);
        // Set when the stream completes (time for the CLI to exit) or the CLI exits
        // (time to drain its pipes).
        let mut finish_deadline: Option<Instant> = None;

        while exit.is_none() || stdout_open || stderr_open {
            let idle = idle_deadline.filter(|_| exit.is_none() && held.is_none());
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return Err(Stop::Cancelled),
                request = recv_steer(&mut self.steer_rx) => match request {
                    Some(request) => self.steer(request),
                    None => self.steer_rx = None,
                },
                line = self.stdout.next_line(), if stdout_open => {
                    let events = match line {
                        Ok(Some(StdoutLine::Line(line))) => self.translator.line(&line),
                        Ok(Some(StdoutLine::Oversized { bytes })) => {
                            tracing::warn!(run_id = %self.run_id, engine = self.vendor.id(), bytes, "oversized cli output line skipped");
                            self.translator.oversized(bytes, self.max_line_bytes)
                        }
                        Ok(None) => {
                            stdout_open = false;
                            if self.server && exit.is_none() {
                                // A server's session is over when its client is
                                // done: stopped then, it ended cleanly.
                                self.child.terminate(self.grace).await;
                                self.child.kill_all();
                                exit = Some(Exit { code: Some(0), signal: None });
                                finish_deadline = Some(Instant::now() + self.grace);
                            }
                            Vec::new()
                        }
                        Err(err) => {
                            tracing::debug!(run_id = %self.run_id, error = %err, "cli stdout read failed");
                            stdout_open = false;
                            Vec::new()
                        }
                    };
                    self.forward(events, &mut held).await?;
                    idle_deadline = self.timeout.map(|timeout| Instant::now() + timeout);
                }
                more = self.stderr.read_more(), if stderr_open => {
                    if more {
                        idle_deadline = self.timeout.map(|timeout| Instant::now() + timeout);
                    } else {
                        stderr_open = false;
                    }
                }
                status = self.child.wait(), if exit.is_none() => {
                    exit = Some(status);
                    // Whatever the CLI left running dies with it, closing the pipes it
                    // held: its group, and descendants that left the group.
                    self.child.kill_all();
                    finish_deadline = Some(Instant::now() + self.grace);
                }
                () = sleep_until(idle) => {
                    // A call waiting for the owner's answer is not inactivity.
                    if self.link.as_ref().is_some_and(GateLink::asking) {
                        idle_deadline = self.timeout.map(|timeout| Instant::now() + timeout);
                        continue;
                    }
                    tracing::warn!(run_id = %self.run_id, engine = self.vendor.id(), "cli run inactive for too long; killing it");
                    self.child.kill().await;
                    let events = self.translator.timed_out();
                    self.forward(events, &mut held).await?;
                    break;
                }
                () = sleep_until(finish_deadline) => {
                    if exit.is_none() {
                        tracing::debug!(run_id = %self.run_id, engine = self.vendor.id(), "cli did not exit after its result; terminating it");
                        exit = Some(self.child.terminate(self.grace).await);
                    }
                    break;
                }
            }
            if held.is_some() && finish_deadline.is_none() {
                // The stream is complete: closing stdin lets a CLI that reads it exit.
                self.stdin = None;
                let wait = if self.server { Duration::ZERO } else { self.grace };
                finish_deadline = Some(Instant::now() + wait);
            }
        }

        if let (Some(exit), None) = (exit, &held) {
            let (stderr, truncated) = self.stderr.text();
            let events = self.translator.exited(exit, &stderr, truncated);
            self.forward(events, &mut held).await?;
        }
        match held {
            Some(completed) => self.send(completed).await,
            None => Ok(()),
        }
    }

    /// Sends events, keeping the `Completed` back for the end.
    async fn forward(
        &self,
        events: Vec<EngineEvent>,
        held: &mut Option<EngineEvent>,
    ) -> Result<(), Stop> {
        for event in events {
            if matches!(event, EngineEvent::Completed(_)) {
                *held = Some(event);
            } else {
                self.send(event).await?;
            }
        }
        Ok(())
    }

    async fn send(&self, event: EngineEvent) -> Result<(), Stop> {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Err(Stop::Cancelled),
            sent = self.sink.send(event) => sent.map_err(|_| Stop::SinkClosed),
        }
    }

    fn steer(&mut self, request: SteerRequest) {
        let result = match &self.stdin {
            Some(stdin) if !self.translator.is_done() => {
                match stdin.write(claude::user_message(&request.text)) {
                    Ok(()) => {
                        self.translator.steered();
                        Ok(())
                    }
                    Err(_) => Err(SteerError::Finished),
                }
            }
            _ => Err(SteerError::Finished),
        };
        let _ = request.reply.send(result);
    }
}

async fn recv_steer(rx: &mut Option<mpsc::Receiver<SteerRequest>>) -> Option<SteerRequest> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
