//! The router actor: the conversation table, the sticky engines, and the
//! interpreter of the queue state machine's effects.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::follow::RunFollower;
use super::journal::Journal;
use super::queue::{Conversation, Effect, Item, RouteChoice, SteerKind};
use super::resolve::{
    check_resume_token, choose_engine, conversation_key, narrow_tools, parse_engine_ref,
    parse_slash_command, project_of, queue_mode, request_model, resolve_binding, strip_prompt,
    ChoiceError, EngineInputs, Refusal, SlashCommand, NATIVE_ONLY_RESUME_MESSAGE,
};
use super::watch::{publish_phase, Watch};
use super::{
    model_from_meta, Accepted, CancelSummary, Origin, Recovered, RequestFlags, RouteError,
    RouterConfig, RunRequest, SessionView,
};
use crate::bus::{EventBus, RunPhase, RunStatus};
use crate::clock::now_ms;
use crate::cluster::{ClusterNode, NodeId, Placement};
use crate::config::QueueMode;
use crate::engine::{
    Availability, Completion, EngineRegistry, Field, InvalidValue, ResumeToken, RunError,
};
use crate::gateway::{self, retry, ExecutionRequest, GatewayHandle, RunEnd, SubmitError};
use crate::ids::{ConversationKey, EngineRef, Model, RunId, SessionKey};
use crate::store::{JournalEntry, JournalRoute, JournalState, StoreError, StoreHandle};
use crate::timing::Stage;

/// A steer whose engine has not answered within this is treated as refused, so
/// a stuck engine cannot hold its conversation's queue forever.
const STEER_ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Journaled requests one cluster sweep looks at, at most.
const SWEEP_REQUESTS: u32 = 4096;

/// What the actor made of a submitted message; the handle adds the follower.
#[derive(Debug)]
pub(super) enum Admitted {
    Run(Accepted),
    Command { command: SlashCommand, reply: String },
}

// A completion with its files is the largest message; messages are moved once
// through a bounded channel, so boxing it would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum RouterMsg {
    Submit {
        req: Box<RunRequest>,
        reply: oneshot::Sender<Result<Admitted, RouteError>>,
    },
    CancelConversation {
        key: ConversationKey,
        reply: oneshot::Sender<CancelSummary>,
    },
    CancelSession {
        session_key: SessionKey,
        reply: oneshot::Sender<CancelSummary>,
    },
    AbortSession {
        session_key: SessionKey,
        reply: oneshot::Sender<CancelSummary>,
    },
    AbortRun {
        run_id: RunId,
        reply: oneshot::Sender<bool>,
    },
    Session {
        session_key: SessionKey,
        reply: oneshot::Sender<SessionView>,
    },
    /// The project directory a channel's binding names, if any.
    BindingDir {
        channel: super::ChannelRef,
        reply: oneshot::Sender<Option<std::path::PathBuf>>,
    },
    /// Requests waiting in the router's queues, per session with any.
    SessionQueues {
        reply: oneshot::Sender<Vec<(SessionKey, usize)>>,
    },
    /// A new generation of the settings: requests accepted from now on use it.
    Reload {
        config: Box<RouterConfig>,
    },
    /// From a run's watcher: the run published `run_completed`.
    RunEnded {
        run_id: RunId,
        conversation: ConversationKey,
        completion: Completion,
        engine: String,
    },
    /// From a steer task: whether the engine took the text.
    SteerAnswered {
        conversation: ConversationKey,
        run_id: RunId,
        accepted: bool,
    },
    /// Cluster mode: requests for `session_key` were journaled for this node.
    Adopt {
        session_key: String,
    },
    /// Cluster mode: adopt what waits in the journal for sessions nobody (or
    /// this node) owns, and let go of sessions with no work left.
    Sweep,
}

fn terminal_phase(completion: &Completion) -> RunPhase {
    match RunStatus::of(completion) {
        RunStatus::Completed => RunPhase::Completed,
        RunStatus::Cancelled => RunPhase::Aborted,
        _ => RunPhase::Failed,
    }
}

fn parse_conversation(raw: &str) -> Option<ConversationKey> {
    if let Some(session) = raw.strip_prefix("session:") {
        return Some(ConversationKey::session(session));
    }
    let (engine, token) = raw.strip_prefix("resume:")?.split_once(':')?;
    Some(ConversationKey::resume(engine, token))
}

/// A run the router already knows by its id.
#[derive(Debug)]
struct KnownRun {
    accepted: Accepted,
    /// The prompt as stored.
    prompt: String,
    /// Queued in the store and not held by this router: an admission whose
    /// caller was told to try again, which landed after all, or a request
    /// that waits on another node.
    stray: bool,
}

fn refused(refusal: Refusal) -> RouteError {
    refusal.into()
}

/// The session a key names: trimmed, and a blank key is the `default` session.
fn session_of(raw: &SessionKey) -> SessionKey {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        "default".into()
    } else if trimmed.len() == raw.len() {
        raw.clone()
    } else {
        trimmed.into()
    }
}

#[derive(Debug)]
pub(super) struct Router {
    rx: mpsc::Receiver<RouterMsg>,
    /// Given to watchers and steer tasks so they can report back.
    tx: mpsc::Sender<RouterMsg>,
    config: RouterConfig,
    gateway: GatewayHandle,
    store: StoreHandle,
    bus: EventBus,
    engines: EngineRegistry,
    token: CancellationToken,
    tracker: TaskTracker,
    journal: Journal,
    /// Conversations with active, queued or in-flight work; removed when idle.
    conversations: HashMap<ConversationKey, Conversation>,
    /// The conversation of every run the router has not seen complete.
    runs: HashMap<RunId, ConversationKey>,
    /// `/engine <id>` choices per session, for the life of the process.
    sticky: HashMap<SessionKey, EngineRef>,
    /// Dispatched requests that are not retries, until their run ends: what a
    /// zero-answer retry resubmits.
    retryable: HashMap<RunId, Item>,
    next_seq: u64,
    /// This node's cluster, in cluster mode: the router runs only the
    /// sessions whose lease the node holds.
    cluster: Option<Arc<ClusterNode>>,
}

impl Router {
    pub(super) fn new(
        config: RouterConfig,
        gateway: GatewayHandle,
        rx: mpsc::Receiver<RouterMsg>,
        tx: mpsc::Sender<RouterMsg>,
        token: CancellationToken,
        tracker: TaskTracker,
    ) -> Self {
        let cluster = gateway.cluster().cloned();
        // Across nodes, journal order is by acceptance time: start the
        // sequence at the clock so entries of nodes and restarts interleave.
        let next_seq = match cluster {
            Some(_) => u64::try_from(now_ms()).unwrap_or(1).saturating_mul(1000),
            None => 1,
        };
        Router {
            rx,
            tx,
            config,
            store: gateway.store().clone(),
            bus: gateway.bus().clone(),
            engines: gateway.engines().clone(),
            journal: Journal::new(gateway.store().clone()),
            gateway,
            token,
            tracker,
            conversations: HashMap::new(),
            runs: HashMap::new(),
            sticky: HashMap::new(),
            retryable: HashMap::new(),
            next_seq,
            cluster,
        }
    }

    pub(super) async fn run(mut self) {
        // Messages wait in the channel until recovery is done, so recovered
        // requests keep their place ahead of new ones. A cluster node recovers
        // a session when it takes the session over, not the whole journal.
        match self.cluster {
            None => {
                if let Err(error) = self.recover().await {
                    tracing::error!(%error, "journal recovery failed; unfinished requests stay journaled");
                }
            }
            Some(_) => self.sweep().await,
        }
        let fenced = self.cluster.as_ref().map(|node| node.fenced()).unwrap_or_default();
        loop {
            tokio::select! {
                biased;
                () = self.token.cancelled() => break,
                () = fenced.cancelled() => {
                    // Whatever this node held is another node's now.
                    tracing::error!("router stopped: this node was fenced");
                    break;
                }
                msg = self.rx.recv() => match msg {
                    Some(msg) => self.handle(msg).await,
                    None => break,
                },
            }
        }
    }

    async fn handle(&mut self, msg: RouterMsg) {
        match msg {
            RouterMsg::Submit { req, reply } => {
                let result = self.submit(*req).await;
                let _ = reply.send(result);
            }
            RouterMsg::CancelConversation { key, reply } => {
                let reason = RunError::UserRequested;
                let summary = self.each_conversation(|k, conv| {
                    if k == &key {
                        conv.cancel_all(&reason)
                    } else {
                        Vec::new()
                    }
                });
                let _ = reply.send(self.apply_summary(summary).await);
            }
            RouterMsg::CancelSession { session_key, reply } => {
                let session = session_of(&session_key);
                let reason = RunError::UserRequested;
                let summary =
                    self.each_conversation(|_, conv| conv.cancel_session(&session, &reason));
                let _ = reply.send(self.apply_summary(summary).await);
            }
            RouterMsg::AbortSession { session_key, reply } => {
                let session = session_of(&session_key);
                let reason = RunError::UserRequested;
                let summary =
                    self.each_conversation(|_, conv| conv.abort_session(&session, &reason));
                let _ = reply.send(self.apply_summary(summary).await);
            }
            RouterMsg::AbortRun { run_id, reply } => {
                let Some(key) = self.runs.get(&run_id).cloned() else {
                    let _ = reply.send(false);
                    return;
                };
                let reason = RunError::UserRequested;
                // A steer still in flight is held too: it completes once answered.
                let (found, effects) = match self.conversations.get_mut(&key) {
                    Some(conv) => (conv.holds(&run_id), conv.abort_run(&run_id, &reason)),
                    None => (false, Vec::new()),
                };
                self.apply(key, effects).await;
                let _ = reply.send(found);
            }
            RouterMsg::BindingDir { channel, reply } => {
                let _ = reply.send(resolve_binding(&self.config.gateway, &channel).cwd);
            }
            RouterMsg::Session { session_key, reply } => {
                let view = self.session_view(&session_of(&session_key)).await;
                let _ = reply.send(view);
            }
            RouterMsg::SessionQueues { reply } => {
                let mut queued: HashMap<&SessionKey, usize> = HashMap::new();
                for item in self.conversations.values().flat_map(|conv| conv.queue()) {
                    *queued.entry(&item.session_key).or_default() += 1;
                }
                let queued = queued.into_iter().map(|(key, n)| (key.clone(), n)).collect();
                let _ = reply.send(queued);
            }
            RouterMsg::Reload { config } => {
                self.config = *config;
                tracing::debug!("router settings reloaded");
            }
            RouterMsg::RunEnded { run_id, conversation, completion, engine } => {
                self.run_ended(run_id, conversation, completion, engine).await;
            }
            RouterMsg::SteerAnswered { conversation, run_id, accepted } => {
                if accepted {
                    // It reached an engine: after a crash it must not run again.
                    self.journal.mark_started(&run_id).await;
                }
                let limits = self.config.limits;
                let effects = match self.conversations.get_mut(&conversation) {
                    Some(conv) => conv.steer_result(&run_id, accepted, Instant::now(), limits),
                    None => Vec::new(),
                };
                self.apply(conversation, effects).await;
            }
            RouterMsg::Adopt { session_key } => self.adopt(&session_key).await,
            RouterMsg::Sweep => self.sweep().await,
        }
    }

    /// Runs `f` over every conversation and collects the effects per conversation
    /// that it touched, ordered by conversation key, so a session-wide cancel or
    /// abort completes its runs in the same order every time (not in the
    /// table's hash order).
    fn each_conversation(
        &mut self,
        mut f: impl FnMut(&ConversationKey, &mut Conversation) -> Vec<Effect>,
    ) -> Vec<(ConversationKey, Vec<Effect>)> {
        let mut touched: Vec<(ConversationKey, Vec<Effect>)> = self
            .conversations
            .iter_mut()
            .map(|(key, conv)| (key.clone(), f(key, conv)))
            .filter(|(_, effects)| !effects.is_empty())
            .collect();
        touched.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        touched
    }

    async fn apply_summary(&mut self, all: Vec<(ConversationKey, Vec<Effect>)>) -> CancelSummary {
        let mut summary = CancelSummary::default();
        for (key, effects) in all {
            for effect in &effects {
                match effect {
                    Effect::Complete { .. } => summary.dropped += 1,
                    Effect::CancelActive { .. } => summary.cancelled += 1,
                    _ => {}
                }
            }
            self.apply(key, effects).await;
        }
        summary
    }

    async fn submit(&mut self, req: RunRequest) -> Result<Admitted, RouteError> {
        let session_key = session_of(&req.session_key);
        if let Some(command) = parse_slash_command(&req.prompt) {
            let reply = self.command(&command, &session_key).await;
            return Ok(Admitted::Command { command, reply });
        }
        if let Some(run_id) = req.run_id.as_ref().filter(|_| !req.flags.fresh_run_id) {
            if let Some(known) = self.known_run(run_id).await? {
                if !self.same_request(&req, &session_key, &known) {
                    return Err(RouteError::RunIdConflict { run_id: run_id.to_string() });
                }
                if known.stray {
                    self.take_up(&known.accepted.session_key).await;
                }
                return Ok(Admitted::Run(known.accepted));
            }
        }
        let arrival = Arrival::of(&req);
        let placement = self.place(&session_key).await?;
        let item = self.prepare(req, session_key).await?;
        if let Some(Placement::Elsewhere { node }) = placement {
            return self.hand_off(item, &node).await;
        }
        let accepted = Accepted {
            run_id: item.run_id.clone(),
            session_key: item.session_key.clone(),
            conversation: item.conversation.clone(),
            engine: item.engine.clone(),
            duplicate: false,
        };
        let key = item.conversation.clone();
        let limits = self.config.limits;
        let run_id = item.run_id.clone();
        let session_key = item.session_key.clone();
        let journaled = journal_entry(&item, now_ms());
        let idle = self.conversations.get(&key).is_none_or(Conversation::is_idle);
        if idle {
            // An idle conversation hands the request straight to the gateway, which
            // writes the row; a refusal is the caller's error and leaves nothing behind.
            self.fence(&run_id, &session_key);
            if let Err(error) = self.journal.admit(journaled).await {
                self.unfence(&run_id);
                return Err(error.into());
            }
            arrival.stamp(&self.bus, &run_id, &accepted.engine);
            let mut conv = Conversation::default();
            let mut effects = conv.submit(item, Instant::now(), limits);
            self.conversations.insert(key.clone(), conv);
            self.runs.insert(run_id.clone(), key.clone());
            let first = match effects.pop() {
                Some(Effect::Dispatch(first)) if effects.is_empty() => first,
                // An idle conversation always dispatches at once; anything else is
                // still carried out rather than lost.
                other => {
                    effects.extend(other);
                    self.apply(key, effects).await;
                    return Ok(Admitted::Run(accepted));
                }
            };
            return match self.dispatch(&key, first, true).await {
                Ok(()) => Ok(Admitted::Run(accepted)),
                Err((_, error)) => {
                    self.journal.complete(&run_id).await;
                    self.forget(&key, &run_id);
                    Err(RouteError::Refused(error))
                }
            };
        }
        // A busy conversation: refused before anything is written when it is
        // full and drops nothing, or when the router already holds as many
        // unfinished requests as `max_pending_runs` (so the gateway never
        // refuses one of them later).
        if self.conversations.get(&key).is_some_and(|conv| limits.refuses(conv)) {
            return Err(RouteError::QueueFull { cap: limits.cap.unwrap_or_default() });
        }
        let pending = self.runs.len();
        if pending >= self.config.gateway.max_pending_runs {
            return Err(RouteError::Refused(SubmitError::Overloaded { pending }));
        }
        // Journaled (and the row written) before the queue acts on it, so nothing
        // a merge, a drop or a steer does is ever undone.
        self.fence(&run_id, &session_key);
        if let Err(error) = self.accept(&journaled).await {
            self.unfence(&run_id);
            return Err(error);
        }
        arrival.stamp(&self.bus, &run_id, &accepted.engine);
        publish_phase(&self.bus, &run_id, &session_key, RunPhase::Accepted);
        self.runs.insert(run_id, key.clone());
        let effects =
            self.conversations.entry(key.clone()).or_default().submit(item, Instant::now(), limits);
        self.apply(key, effects).await;
        Ok(Admitted::Run(accepted))
    }

    /// Drops a request that was never accepted from the router's tables.
    fn forget(&mut self, key: &ConversationKey, run_id: &RunId) {
        self.runs.remove(run_id);
        self.unfence(run_id);
        if self.conversations.get(key).is_some_and(Conversation::is_idle) {
            self.conversations.remove(key);
        }
    }

    /// A caller id seen before, with what the first request asked for.
    async fn known_run(&self, run_id: &RunId) -> Result<Option<KnownRun>, RouteError> {
        if let Some(key) = self.runs.get(run_id) {
            if let Some(item) = self.conversations.get(key).and_then(|c| c.find(run_id)) {
                return Ok(Some(KnownRun {
                    accepted: Accepted {
                        run_id: run_id.clone(),
                        session_key: item.session_key.clone(),
                        conversation: key.clone(),
                        engine: item.engine.clone(),
                        duplicate: true,
                    },
                    prompt: item.prompt.clone(),
                    stray: false,
                }));
            }
        }
        let Some(record) = self.store.get_run(run_id.as_str()).await? else { return Ok(None) };
        let conversation = parse_conversation(&record.conversation)
            .unwrap_or_else(|| ConversationKey::session(&record.session_key));
        Ok(Some(KnownRun {
            accepted: Accepted {
                run_id: run_id.clone(),
                session_key: record.session_key,
                conversation,
                engine: EngineRef::parse(&record.engine).map_err(|err| {
                    StoreError::Corrupt(format!(
                        "run {run_id} names engine {:?}: {err}",
                        record.engine
                    ))
                })?,
                duplicate: true,
            },
            stray: record.status == RunStatus::Queued,
            prompt: record.prompt,
        }))
    }

    /// Makes sure the journaled requests of `session_key` that this router
    /// does not hold yet are run: by this node, when it holds the session (or
    /// runs alone), else by the session's node, which is told.
    async fn take_up(&mut self, session_key: &SessionKey) {
        let session_key = session_of(session_key);
        if let Some(node) = self.cluster.clone() {
            match node.place_session(session_key.as_str()).await {
                Ok(Placement::Here { .. }) => {}
                Ok(Placement::Elsewhere { node: owner }) => {
                    if let Err(error) = node.hand_off(&owner, session_key.as_str()).await {
                        tracing::debug!(%error, %owner, "handoff not notified; the owner finds it at its next sweep");
                    }
                    return;
                }
                Err(error) => {
                    tracing::debug!(%error, session_key = session_key.as_str(), "session not placed; the next sweep tries again");
                    return;
                }
            }
        }
        let sessions = HashSet::from([session_key.as_str().to_owned()]);
        if let Err(error) = self.adopt_sessions(&sessions).await {
            tracing::warn!(%error, session_key = session_key.as_str(), "journaled requests not taken up");
        }
    }

    /// Whether a request that reuses a known run id asks for the same thing: the
    /// same session, the same prompt (as the router stored it, after taking out a
    /// resume line and a directive; a queued followup may have had later text
    /// merged after it) and, when it names one, the same engine. A repeated
    /// request is a retry and answers `duplicate`; anything else is a conflict.
    fn same_request(&self, req: &RunRequest, session_key: &SessionKey, known: &KnownRun) -> bool {
        if known.accepted.session_key != *session_key {
            return false;
        }
        let stripped =
            strip_prompt(&self.engines, &req.prompt, req.resume.is_some(), self.config.native_only);
        let prompt = stripped.prompt;
        let same_prompt = known.prompt == prompt
            || known.prompt == req.prompt
            || known.prompt.starts_with(&format!("{prompt}\n"));
        let named = req
            .engine
            .clone()
            .or_else(|| stripped.directive.and_then(Result::ok).map(|d| d.engine));
        let same_engine = named.is_none_or(|e| e.id() == known.accepted.engine.id());
        same_prompt && same_engine
    }

    /// Resolves resume, engine, conversation, cwd and queue mode.
    async fn prepare(
        &mut self,
        req: RunRequest,
        session_key: SessionKey,
    ) -> Result<Item, RouteError> {
        let binding = req
            .channel
            .as_ref()
            .map(|c| resolve_binding(&self.config.gateway, c))
            .unwrap_or_default();
        let native_only = self.config.native_only;
        let stripped = strip_prompt(&self.engines, &req.prompt, req.resume.is_some(), native_only);
        let mut explicit = req.resume;
        if let Some(token) = &explicit {
            check_resume_token(&self.engines, token, Field::ResumeEngine, Field::ResumeValue)
                .map_err(refused)?;
        } else if let Some(token) = stripped.resume {
            check_resume_token(&self.engines, &token, Field::Prompt, Field::Prompt)
                .map_err(refused)?;
            explicit = Some(token);
        }
        let prompt = stripped.prompt;
        let directive = stripped.directive.transpose().map_err(refused)?;
        let chosen_engine = if native_only {
            None
        } else {
            req.engine
                .or_else(|| directive.map(|d| d.engine))
                .or_else(|| self.sticky.get(&session_key).cloned())
        };
        let auto_resume = explicit.is_none() && !req.flags.no_auto_resume;
        let fallback_engine =
            binding.default_engine.clone().unwrap_or_else(|| self.config.default_engine.clone());
        let route = RouteChoice { auto_resume, chosen_engine, fallback_engine };
        let chat_state = if auto_resume { self.chat_state(&session_key).await } else { None };
        let choice = choose_engine(EngineInputs {
            explicit_resume: explicit.clone(),
            chosen: route.chosen_engine.as_ref(),
            chat_state,
            binding_engine: Some(&route.fallback_engine),
            default_engine: &self.config.default_engine,
            native_only,
        })
        .map_err(|err| match err {
            ChoiceError::UnsupportedResumeEngine { engine } => {
                RouteError::UnsupportedResumeEngine {
                    engine,
                    message: NATIVE_ONLY_RESUME_MESSAGE.to_owned(),
                }
            }
            ChoiceError::UnknownEngine { engine } => {
                RouteError::UnknownEngine { engine, known: self.engine_ids() }
            }
        })?;
        if self.engines.engine(choice.engine.id()).is_none() {
            return Err(RouteError::UnknownEngine {
                engine: choice.engine.to_string(),
                known: self.engine_ids(),
            });
        }
        // Whatever chose it (a binding, a project, `default_engine`, `/engine`), the
        // model part was checked when it was parsed; the request's model is checked here.
        let model = req
            .model
            .as_deref()
            .map(|m| request_model(m, &choice.engine))
            .transpose()
            .map_err(refused)?;
        let conversation = conversation_key(&session_key, explicit.as_ref());
        let mode = queue_mode(req.queue_mode, binding.queue_mode, self.config.queue_mode);
        let mut meta = req.meta;
        // The caller's own keys win: the router only fills in what is missing.
        meta.entry("origin".to_owned()).or_insert_with(|| req.origin.as_str().into());
        if let Some(agent_id) = req.agent_id.or(binding.agent_id) {
            meta.entry("agent_id".to_owned()).or_insert_with(|| agent_id.into());
        }
        if let Some(source) = choice.source {
            meta.insert("resume_source".to_owned(), source.as_str().into());
        }
        // Where the message came from, as the channel says and never as the
        // caller's meta claims: it picks the binding's approval rules.
        match &req.channel {
            Some(channel) => meta.insert("channel".to_owned(), channel.to_meta()),
            None => meta.remove("channel"),
        };
        let cwd = req.cwd.filter(|c| !c.as_os_str().is_empty()).or(binding.cwd);
        if let Some(cwd) = &cwd {
            if !crate::config::cwd_allowed(&self.config.gateway.allowed_cwd_roots, cwd) {
                return Err(RouteError::CwdNotAllowed { cwd: cwd.display().to_string() });
            }
        }
        // The tools the run is offered: what the request asked for, within
        // its project's and its binding's lists (journaled with `meta`).
        let project = project_of(&self.config.gateway, binding.project.as_deref(), cwd.as_deref());
        narrow_tools(&mut meta, project.and_then(|p| p.tools.as_deref()), binding.tools.as_deref());
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(Item {
            run_id: req.run_id.unwrap_or_else(RunId::generate),
            session_key,
            conversation,
            prompt,
            engine: choice.engine,
            resume: choice.resume,
            cwd,
            model,
            flags: req.flags,
            meta,
            origin: req.origin,
            mode,
            seq,
            suppress_phases: false,
            route,
            budget: binding.budget,
        })
    }

    /// The session's stored engine and token. A token its engine would refuse (a
    /// store written by hand, or by an older version) is ignored with a warning, so
    /// it never reaches a command line.
    async fn chat_state(&self, session_key: &SessionKey) -> Option<ResumeToken> {
        let token = match self.store.get_chat_state(session_key, now_ms()).await {
            Ok(state) => state.map(|s| ResumeToken::new(s.last_engine, s.last_resume_token))?,
            Err(error) => {
                tracing::warn!(
                    %error,
                    session_key = session_key.as_str(),
                    "chat state unreadable; starting a new session"
                );
                return None;
            }
        };
        match check_resume_token(&self.engines, &token, Field::ResumeEngine, Field::ResumeValue) {
            Ok(()) => Some(token),
            Err(refusal) => {
                tracing::warn!(
                    session_key = session_key.as_str(),
                    field = %refusal.field,
                    reason = %refusal.why,
                    "{}; the stored session is ignored and a new one starts",
                    refusal.what
                );
                None
            }
        }
    }

    /// Writes the run row (so the API shows it as queued) and the journal entry,
    /// and waits until both are durable.
    async fn accept(&self, entry: &JournalEntry) -> Result<(), RouteError> {
        self.store.insert_run(entry.new_run()).await;
        self.journal.admit(entry.clone()).await?;
        Ok(())
    }

    /// Carries out effects, and those they lead to, then forgets the conversation
    /// if it became idle.
    async fn apply(&mut self, key: ConversationKey, effects: Vec<Effect>) {
        let mut work: VecDeque<Effect> = effects.into();
        while let Some(effect) = work.pop_front() {
            match effect {
                Effect::Dispatch(item) => {
                    if let Err((item, error)) = self.dispatch(&key, item, false).await {
                        if matches!(error, SubmitError::ShuttingDown) {
                            // Accepted and journaled: it runs at the next start.
                            tracing::debug!(run_id = %item.run_id, "queued request left for the next start");
                            continue;
                        }
                        let error = match error {
                            SubmitError::UnknownEngine { engine } => {
                                RunError::UnknownEngine { engine }
                            }
                            other => RunError::StartFailed { detail: other.to_string() },
                        };
                        tracing::warn!(run_id = %item.run_id, %error, "gateway refused a queued request");
                        let completion = Completion::failure(error, item.resume.clone());
                        if !item.suppress_phases {
                            publish_phase(
                                &self.bus,
                                &item.run_id,
                                &item.session_key,
                                RunPhase::Failed,
                            );
                        }
                        let engine = item.engine.to_string();
                        self.complete(&item.run_id, &item.session_key, &engine, completion, 1)
                            .await;
                        if let Some(conv) = self.conversations.get_mut(&key) {
                            work.extend(conv.dispatch_failed());
                        }
                    }
                }
                Effect::CancelActive { run_id, reason } => {
                    let _ = self.gateway.cancel(&run_id, reason).await;
                }
                Effect::Steer { host, kind, run_id, text } => {
                    self.spawn_steer(&key, host, kind, run_id, text)
                }
                Effect::Complete { item, completion, engine } => {
                    self.complete(&item.run_id, &item.session_key, &engine, completion, 1).await;
                }
                Effect::Rejournal(item) => {
                    if let Err(error) = self.journal.admit(journal_entry(&item, now_ms())).await {
                        tracing::warn!(%error, run_id = %item.run_id, "merged request not re-journaled");
                    }
                }
                Effect::Phase { run_id, session_key, phase } => {
                    publish_phase(&self.bus, &run_id, &session_key, phase);
                }
            }
        }
        if self.conversations.get(&key).is_some_and(Conversation::is_idle) {
            self.conversations.remove(&key);
        }
    }

    /// Submits the item to the gateway, where it becomes the conversation's active
    /// run. `fresh` items were accepted just now and announce it. A refusal gives
    /// the item back.
    async fn dispatch(
        &mut self,
        key: &ConversationKey,
        mut item: Item,
        fresh: bool,
    ) -> Result<(), (Item, SubmitError)> {
        if item.route.auto_resume {
            // The run ahead may have just stored a newer session (or lost it to an
            // overflow); continue whatever the session holds now.
            let chat_state = self.chat_state(&item.session_key).await;
            if let Ok(choice) = choose_engine(EngineInputs {
                explicit_resume: None,
                chosen: item.route.chosen_engine.as_ref(),
                chat_state,
                binding_engine: Some(&item.route.fallback_engine),
                default_engine: &self.config.default_engine,
                native_only: self.config.native_only,
            }) {
                if self.engines.engine(choice.engine.id()).is_some() {
                    item.engine = choice.engine;
                    item.resume = choice.resume;
                    match choice.source {
                        Some(source) => {
                            item.meta.insert("resume_source".to_owned(), source.as_str().into());
                        }
                        None => {
                            item.meta.remove("resume_source");
                        }
                    }
                }
            }
        }
        // Subscribed before the gateway has the run, so every event arrives live.
        let live = self.bus.subscribe_run(&item.run_id);
        let events = RunFollower::new(item.run_id.clone(), live, self.store.clone(), true);
        let req = ExecutionRequest {
            run_id: Some(item.run_id.clone()),
            conversation: item.conversation.clone(),
            session_key: item.session_key.clone(),
            prompt: item.prompt.clone(),
            engine: item.engine.clone(),
            resume: item.resume.clone(),
            cwd: item.cwd.clone(),
            model: item.model.clone(),
            meta: item.meta.clone(),
            journaled: true,
            budget: item.budget.map(Box::new),
        };
        self.bus.timings().stamp(&item.run_id, Stage::Queued);
        match self.gateway.submit(req).await {
            Ok(_) => {
                if fresh {
                    publish_phase(&self.bus, &item.run_id, &item.session_key, RunPhase::Accepted);
                }
                if !item.suppress_phases {
                    publish_phase(
                        &self.bus,
                        &item.run_id,
                        &item.session_key,
                        RunPhase::WaitingForSlot,
                    );
                }
                let watch = Watch {
                    run_id: item.run_id.clone(),
                    session_key: item.session_key.clone(),
                    events,
                    gateway: self.gateway.clone(),
                    journal: self.journal.clone(),
                    bus: self.bus.clone(),
                    idle_watchdog: self.config.idle_watchdog,
                    suppress_phases: item.suppress_phases,
                };
                let (router, token) = (self.tx.clone(), self.token.clone());
                let (run_id, conversation) = (item.run_id.clone(), key.clone());
                self.tracker.spawn(async move {
                    let ended = tokio::select! {
                        biased;
                        () = token.cancelled() => return,
                        ended = watch.run() => ended,
                    };
                    let (completion, engine) = ended;
                    let msg = RouterMsg::RunEnded { run_id, conversation, completion, engine };
                    let _ = router.send(msg).await;
                });
                if !item.meta.contains_key(retry::ATTEMPT_KEY) {
                    self.retryable.insert(item.run_id.clone(), item.clone());
                }
                self.conversations.entry(key.clone()).or_default().set_active(&item);
                Ok(())
            }
            Err(error) => Err((item, error)),
        }
    }

    fn spawn_steer(
        &self,
        key: &ConversationKey,
        host: RunId,
        kind: SteerKind,
        run_id: RunId,
        text: String,
    ) {
        let gateway = self.gateway.clone();
        let tx = self.tx.clone();
        let conversation = key.clone();
        self.tracker.spawn(async move {
            let delivered = async {
                match kind {
                    SteerKind::Steer | SteerKind::SteerBacklog => gateway.steer(&host, &text).await,
                    SteerKind::Redirect => gateway.redirect(&host, &text).await,
                }
            };
            let accepted =
                matches!(tokio::time::timeout(STEER_ANSWER_TIMEOUT, delivered).await, Ok(Ok(())));
            let _ = tx.send(RouterMsg::SteerAnswered { conversation, run_id, accepted }).await;
        });
    }

    /// Completes a run the gateway never finished (the store and the bus, as
    /// every completion), then the journal.
    async fn complete(
        &mut self,
        run_id: &RunId,
        session_key: &SessionKey,
        engine: &str,
        completion: Completion,
        index: u64,
    ) {
        self.runs.remove(run_id);
        let end = RunEnd {
            run_id: run_id.clone(),
            session_key: session_key.clone(),
            index,
            engine: engine.to_owned(),
            completion,
            duration_ms: 0,
            spend: crate::budget::usage::RunSpend::default(),
        };
        gateway::complete(&self.bus, &self.store, end).await;
        self.journal.complete(run_id).await;
        self.unfence(run_id);
    }

    async fn run_ended(
        &mut self,
        run_id: RunId,
        key: ConversationKey,
        completion: Completion,
        engine: String,
    ) {
        self.runs.remove(&run_id);
        let original = self.retryable.remove(&run_id);
        let mut completion = completion;
        let retry = completion.retried_by.take();
        let active = self
            .conversations
            .get(&key)
            .and_then(Conversation::active)
            .filter(|a| a.run_id == run_id)
            .map(|a| a.session_key.clone());
        let Some(session_key) = active else {
            if let Some(retry) = retry {
                // Nothing to resubmit: whoever follows the retry gets the failure.
                let session_key = completion_session(original.as_ref(), &run_id);
                self.complete(&retry, &session_key, &engine, completion, 1).await;
            }
            return;
        };
        publish_phase(&self.bus, &run_id, &session_key, terminal_phase(&completion));
        self.record_session(&session_key, &completion).await;
        if let Some(retry) = retry {
            // Journaled before the failed request leaves the journal, so a crash
            // in between cannot lose the one answer the caller waits for.
            self.queue_retry(&key, &session_key, original, retry, &completion, &engine).await;
        }
        self.journal.complete(&run_id).await;
        self.unfence(&run_id);
        let effects = match self.conversations.get_mut(&key) {
            Some(conv) => conv.run_ended(&run_id, &completion, &engine),
            None => Vec::new(),
        };
        self.apply(key, effects).await;
    }

    /// Journals the retry of a run that failed without an answer and queues it
    /// first in its conversation. When it cannot be journaled (or the request
    /// is not at hand), the retry completes with the failure, so whoever follows
    /// it hears the one answer there is.
    async fn queue_retry(
        &mut self,
        key: &ConversationKey,
        session_key: &SessionKey,
        original: Option<Item>,
        retry: RunId,
        failed: &Completion,
        engine: &str,
    ) {
        let reason = retry::failure_reason(failed);
        let Some(original) = original else {
            tracing::warn!(run_id = %retry, "retried request not at hand; its failure stands");
            self.complete(&retry, session_key, engine, failed.clone(), 1).await;
            return;
        };
        let item = retry_item(&original, retry, &reason, failed.resume.clone());
        self.fence(&item.run_id, &item.session_key);
        if let Err(error) = self.accept(&journal_entry(&item, now_ms())).await {
            tracing::warn!(%error, run_id = %item.run_id, "retry not journaled; the failure stands");
            self.complete(&item.run_id, &item.session_key, engine, failed.clone(), 1).await;
            return;
        }
        tracing::info!(run_id = %original.run_id, retry = %item.run_id, "run failed without an answer; retrying once");
        publish_phase(&self.bus, &item.run_id, &item.session_key, RunPhase::Accepted);
        self.runs.insert(item.run_id.clone(), key.clone());
        self.conversations.entry(key.clone()).or_default().queue_first(item);
    }

    /// After a restart: the retry a completed request names, when it was never
    /// journaled (the gateway stopped between the failure and the router).
    async fn unqueued_retry(
        &self,
        entry: &JournalEntry,
    ) -> Result<Option<(RunId, String)>, RouteError> {
        let events = self.store.run_events(entry.run_id.as_str()).await?;
        let Some(completed) = events.iter().rev().find(|e| e.kind == "run_completed") else {
            return Ok(None);
        };
        let text = |key: &str| completed.data.get(key).and_then(serde_json::Value::as_str);
        let Some(retry) = text("retried_by").and_then(RunId::parse) else { return Ok(None) };
        if self.store.get_run(retry.as_str()).await?.is_some() {
            return Ok(None);
        }
        Ok(Some((retry, text("error").unwrap_or("no answer").to_owned())))
    }

    /// Chat state after a run: an overflow forgets the session so the next
    /// message starts fresh; otherwise a resume token is kept for auto-resume.
    async fn record_session(&self, session_key: &SessionKey, completion: &Completion) {
        if completion.error.as_ref().is_some_and(RunError::is_context_overflow) {
            tracing::info!(
                session_key = session_key.as_str(),
                "context overflow; the next message starts a new session"
            );
            self.store.delete_chat_state(session_key).await;
            return;
        }
        if let Some(token) = &completion.resume {
            self.store.put_chat_state(session_key, &token.engine, &token.value, now_ms()).await;
        }
    }

    async fn session_view(&self, session_key: &SessionKey) -> SessionView {
        let mut view = SessionView {
            session_key: session_key.clone(),
            active: Vec::new(),
            queued: Vec::new(),
            pending_steers: 0,
            chat_state: None,
            sticky_engine: None,
        };
        let mut queued: Vec<&Item> = Vec::new();
        for conv in self.conversations.values() {
            if let Some(active) = conv.active().filter(|a| &a.session_key == session_key) {
                view.active.push(active.run_id.clone());
            }
            queued.extend(conv.queue().filter(|i| &i.session_key == session_key));
            view.pending_steers += conv.pending_steers_of(session_key);
        }
        view.queued = queued.into_iter().map(|i| i.run_id.clone()).collect();
        view.chat_state = self.store.get_chat_state(session_key, now_ms()).await.ok().flatten();
        view.sticky_engine = self.sticky.get(session_key).cloned();
        view
    }

    /// Every registered engine's id, sorted.
    fn engine_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.engines.ids().map(|id| id.to_string()).collect();
        ids.sort();
        ids
    }

    /// The engine a session's next message runs on: its `/engine` choice, else
    /// the one it last ran, else the default.
    async fn current_engine(&self, session_key: &SessionKey) -> String {
        let view = self.session_view(session_key).await;
        view.sticky_engine
            .as_ref()
            .map(ToString::to_string)
            .or_else(|| view.chat_state.as_ref().map(|s| s.last_engine.clone()))
            .unwrap_or_else(|| self.config.default_engine.to_string())
    }

    /// `/engine`: every engine, available or why not, and the session's current one.
    async fn engine_list(&self, session_key: &SessionKey) -> String {
        let mut engines: Vec<_> = self.engines.iter().collect();
        engines.sort_by_key(|engine| engine.id().to_string());
        let lines: Vec<String> = engines
            .iter()
            .map(|engine| match engine.availability() {
                Availability::Available => format!("{}: available", engine.id()),
                Availability::Unavailable { reason } => {
                    format!("{}: not available ({})", engine.id(), reason.short())
                }
            })
            .collect();
        format!(
            "This session uses {}.\nEngines:\n{}\nChoose one with /engine <name>.",
            self.current_engine(session_key).await,
            lines.join("\n")
        )
    }

    async fn command(&mut self, command: &SlashCommand, session_key: &SessionKey) -> String {
        match command {
            SlashCommand::Cancel => {
                let reason = RunError::UserRequested;
                let summary =
                    self.each_conversation(|_, conv| conv.cancel_session(session_key, &reason));
                let summary = self.apply_summary(summary).await;
                if summary.cancelled == 0 {
                    "Nothing is running.".to_owned()
                } else {
                    "Cancelling the current run.".to_owned()
                }
            }
            SlashCommand::New => {
                self.store.delete_chat_state(session_key).await;
                "The next message starts a new session.".to_owned()
            }
            SlashCommand::Status => {
                let view = self.session_view(session_key).await;
                let running = match view.active.first() {
                    Some(run_id) => format!("running {run_id}"),
                    None => "idle".to_owned(),
                };
                let engine = self.current_engine(session_key).await;
                let status = format!(
                    "Session {session_key}: {running}, {} queued, engine {engine}.",
                    view.queued.len()
                );
                let budget = crate::budget::store_guard::session_report(
                    &self.store,
                    &self.config.gateway.budgets,
                    session_key,
                    None,
                    now_ms(),
                )
                .await;
                match budget {
                    Ok(budget) => format!("{status}\n{}", spend_today_line(&budget)),
                    Err(error) => {
                        tracing::warn!(%session_key, %error, "could not read the session's spend");
                        status
                    }
                }
            }
            SlashCommand::Engine(None) => self.engine_list(session_key).await,
            SlashCommand::Engine(Some(raw)) => {
                let engine = match parse_engine_ref(raw, Field::Prompt) {
                    Ok(engine) => engine,
                    // An id of the wrong shape names no engine.
                    Err(refusal) if refusal.why == InvalidValue::Shape => {
                        return format!(
                            "Unknown engine {raw}. The engines are {}.",
                            self.engine_ids().join(", ")
                        );
                    }
                    Err(refusal) => return super::sentence(&refusal.what),
                };
                let Some(found) = self.engines.engine(engine.id()) else {
                    return format!(
                        "Unknown engine {engine}. The engines are {}.",
                        self.engine_ids().join(", ")
                    );
                };
                if let Availability::Unavailable { reason } = found.availability() {
                    return format!(
                        "{engine} is not available: {}. This session keeps {}.",
                        reason.short(),
                        self.current_engine(session_key).await
                    );
                }
                self.sticky.insert(session_key.clone(), engine.clone());
                format!("This session now uses {engine}.")
            }
        }
    }

    /// Writes of `run_id` land only while this node holds `session_key`'s
    /// lease (cluster mode; nothing otherwise).
    fn fence(&self, run_id: &RunId, session_key: &SessionKey) {
        let Some(node) = &self.cluster else { return };
        if let Some(lease) = node.session_lease(session_key.as_str()) {
            node.register_run(run_id.as_str(), &lease);
        }
    }

    /// The last write of `run_id` is queued.
    fn unfence(&self, run_id: &RunId) {
        if let Some(node) = &self.cluster {
            node.forget_run(run_id.as_str());
        }
    }

    /// Where `session_key` runs (cluster mode; `None` otherwise). A session this
    /// node just took gets whatever its journal holds first, so earlier
    /// requests stay ahead of the new one.
    async fn place(&mut self, session_key: &SessionKey) -> Result<Option<Placement>, RouteError> {
        let Some(node) = self.cluster.clone() else { return Ok(None) };
        let placement = node
            .place_session(session_key.as_str())
            .await
            .map_err(|error| StoreError::Database(format!("cluster: {error}")))?;
        if let Placement::Here { acquired: true, .. } = &placement {
            // A session nobody held with nothing journaled has nothing to adopt.
            let journaled = node
                .has_journaled(session_key.as_str())
                .await
                .map_err(|error| StoreError::Database(format!("cluster: {error}")))?;
            if !journaled {
                return Ok(Some(placement));
            }
            let sessions = HashSet::from([session_key.as_str().to_owned()]);
            self.adopt_sessions(&sessions).await.map_err(|error| {
                tracing::warn!(%error, session_key = session_key.as_str(), "journal of a session taken over not read");
                error
            })?;
        }
        Ok(Some(placement))
    }

    /// Journals a request for a session `owner` runs and tells the owner,
    /// which takes it from the journal (at once on the notification, at its
    /// next sweep otherwise).
    async fn hand_off(&mut self, item: Item, owner: &NodeId) -> Result<Admitted, RouteError> {
        let accepted = Accepted {
            run_id: item.run_id.clone(),
            session_key: item.session_key.clone(),
            conversation: item.conversation.clone(),
            engine: item.engine.clone(),
            duplicate: false,
        };
        self.accept(&journal_entry(&item, now_ms())).await?;
        publish_phase(&self.bus, &item.run_id, &item.session_key, RunPhase::Accepted);
        if let Some(node) = &self.cluster {
            if let Err(error) = node.hand_off(owner, item.session_key.as_str()).await {
                tracing::debug!(%error, %owner, "handoff not notified; the owner finds it at its next sweep");
            }
        }
        tracing::debug!(run_id = %item.run_id, %owner, "request handed to the session's node");
        Ok(Admitted::Run(accepted))
    }

    /// A notification says requests for `session_key` wait for this node.
    async fn adopt(&mut self, session_key: &str) {
        let Some(node) = self.cluster.clone() else { return };
        match node.place_session(session_key).await {
            Ok(Placement::Here { .. }) => {
                let sessions = HashSet::from([session_key.to_owned()]);
                if let Err(error) = self.adopt_sessions(&sessions).await {
                    tracing::warn!(%error, session_key, "handed-off requests not adopted; the next sweep tries again");
                }
            }
            Ok(Placement::Elsewhere { .. }) => {}
            Err(error) => {
                tracing::debug!(%error, session_key, "handoff not placed; the next sweep tries again");
            }
        }
    }

    /// Takes the journal's requests for `sessions` (which this node holds)
    /// that the router does not know yet: those another node handed over, and
    /// those a node that lost the session left. They are recovered as after a
    /// restart, in acceptance order.
    async fn adopt_sessions(&mut self, sessions: &HashSet<String>) -> Result<(), RouteError> {
        let mut entries: Vec<JournalEntry> = self
            .journal
            .pending()
            .await?
            .into_iter()
            .filter(|e| sessions.contains(session_of(&e.session_key).as_str()))
            .filter(|e| !self.runs.contains_key(&e.run_id))
            .collect();
        entries.sort_by_key(|e| (e.accepted_at_ms, e.seq));
        let mut recovered = Recovered::default();
        for entry in entries {
            self.recover_entry(entry, &mut recovered).await?;
        }
        if recovered != Recovered::default() {
            tracing::info!(
                requeued = recovered.requeued,
                interrupted = recovered.interrupted,
                expired = recovered.expired,
                "sessions adopted"
            );
        }
        Ok(())
    }

    /// Cluster mode, every sweep interval and whenever notifications may have
    /// been missed: adopts what waits in the journal for sessions with no
    /// live owner or owned here, then lets go of sessions with no work here,
    /// once everything written under them is durable.
    async fn sweep(&mut self) {
        let Some(node) = self.cluster.clone() else { return };
        if node.is_fenced() {
            return;
        }
        match node.journal_candidates(SWEEP_REQUESTS).await {
            Ok(candidates) => {
                // Only sessions with a request this router does not know yet.
                let unknown: HashSet<String> = candidates
                    .into_iter()
                    .filter(|(_, run_id)| {
                        RunId::parse(run_id).is_none_or(|run_id| !self.runs.contains_key(&run_id))
                    })
                    .map(|(session_key, _)| session_key)
                    .collect();
                let mut mine = HashSet::new();
                for key in unknown {
                    match node.place_session(&key).await {
                        Ok(Placement::Here { .. }) => {
                            mine.insert(key);
                        }
                        Ok(Placement::Elsewhere { .. }) => {}
                        Err(error) => {
                            tracing::debug!(%error, session_key = key, "session not placed");
                        }
                    }
                }
                if !mine.is_empty() {
                    if let Err(error) = self.adopt_sessions(&mine).await {
                        tracing::warn!(%error, "sessions not adopted; the next sweep tries again");
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "cluster sweep failed; trying again"),
        }
        let busy: HashSet<&SessionKey> =
            self.conversations.values().flat_map(Conversation::sessions).collect();
        let idle: Vec<String> = node
            .held_sessions()
            .into_iter()
            .filter(|key| !busy.iter().any(|b| b.as_str() == key))
            .collect();
        if idle.is_empty() {
            return;
        }
        // A completion still queued must land before another node may read
        // the session's journal, or it would run the request again.
        if let Err(error) = self.store.flush().await {
            tracing::debug!(%error, "idle sessions kept: the store is not writable");
            return;
        }
        for key in idle {
            node.release_session(&key).await;
        }
    }

    /// Handles what a crash left in the journal, once, before new requests:
    /// requests that never started are queued again in acceptance order; those
    /// that were running complete as `interrupted` with their last resume token.
    async fn recover(&mut self) -> Result<Recovered, RouteError> {
        let entries = self.journal.pending().await?;
        let mut recovered = Recovered::default();
        for entry in entries {
            self.recover_entry(entry, &mut recovered).await?;
        }
        if recovered != Recovered::default() {
            tracing::info!(
                requeued = recovered.requeued,
                interrupted = recovered.interrupted,
                expired = recovered.expired,
                "journal recovered"
            );
        }
        Ok(recovered)
    }

    /// Handles one entry a crash (or, in cluster mode, another node) left in
    /// the journal: requeued, completed `interrupted` or `expired`, or removed
    /// when its run already finished.
    async fn recover_entry(
        &mut self,
        entry: JournalEntry,
        recovered: &mut Recovered,
    ) -> Result<(), RouteError> {
        self.next_seq = self.next_seq.max(entry.seq + 1);
        let session_key = session_of(&entry.session_key);
        // Everything written for it from here on is fenced by this node's lease.
        self.fence(&entry.run_id, &session_key);
        let record = self.store.get_run(entry.run_id.as_str()).await?;
        if record.as_ref().is_some_and(|r| r.status.is_terminal()) {
            if let Some((retry, reason)) = self.unqueued_retry(&entry).await? {
                if let Ok(original) = item_from_entry(entry.clone()) {
                    let item = retry_item(&original, retry, &reason, None);
                    self.fence(&item.run_id, &item.session_key);
                    self.accept(&journal_entry(&item, now_ms())).await?;
                    recovered.requeued += 1;
                    self.queue_recovered(item).await;
                }
            }
            self.journal.complete(&entry.run_id).await;
            self.unfence(&entry.run_id);
            return Ok(());
        }
        let started = entry.state == JournalState::Started
            || record.as_ref().is_some_and(|r| r.status == RunStatus::Running);
        if started {
            recovered.interrupted += 1;
            return self.interrupt_recovered(&entry).await;
        }
        let age_ms = now_ms().saturating_sub(entry.accepted_at_ms);
        if u128::try_from(age_ms).unwrap_or(0) > self.config.recovered_max_age.as_millis() {
            recovered.expired += 1;
            let completion = Completion::failure(RunError::Expired, entry.resume.clone());
            self.complete(&entry.run_id, &session_key, &entry.engine, completion, 1).await;
            return Ok(());
        }
        let item = match item_from_entry(entry.clone()) {
            Ok(item) => item,
            Err(engine) => {
                // A journal written with an engine this version cannot name.
                tracing::warn!(run_id = %entry.run_id, "journaled request names no engine id");
                let error = RunError::UnknownEngine { engine };
                let completion = Completion::failure(error, entry.resume.clone());
                self.complete(&entry.run_id, &session_key, &entry.engine, completion, 1).await;
                return Ok(());
            }
        };
        recovered.requeued += 1;
        self.queue_recovered(item).await;
        Ok(())
    }

    /// Queues a recovered request in its conversation, past the queue's cap:
    /// it was accepted before.
    async fn queue_recovered(&mut self, item: Item) {
        let key = item.conversation.clone();
        self.runs.insert(item.run_id.clone(), key.clone());
        let limits = super::Limits { cap: None, ..self.config.limits };
        let effects =
            self.conversations.entry(key.clone()).or_default().submit(item, Instant::now(), limits);
        self.apply(key, effects).await;
    }

    async fn interrupt_recovered(&mut self, entry: &JournalEntry) -> Result<(), RouteError> {
        let events = self.store.run_events(entry.run_id.as_str()).await?;
        if let Some(done) = events.iter().find(|e| e.kind == "run_completed") {
            // Its node stored the completion and lost the rest (the final row,
            // the journal's removal) to a crash or a fence: the run has its
            // one completion, and the row is finished from it.
            self.finish_from_stored(entry, done).await;
            return Ok(());
        }
        let next_index = events.iter().map(|e| e.index).max().unwrap_or(0) + 1;
        let resume = events
            .iter()
            .rev()
            .find_map(crate::store::StoredEvent::resume)
            .or_else(|| entry.resume.clone());
        let completion = Completion::failure(RunError::Interrupted, resume);
        let session_key = session_of(&entry.session_key);
        self.record_session(&session_key, &completion).await;
        self.complete(&entry.run_id, &session_key, &entry.engine, completion, next_index).await;
        Ok(())
    }

    /// Finishes a recovered run whose `run_completed` is stored: its row,
    /// its session, its journal entry; nothing is written twice.
    async fn finish_from_stored(&mut self, entry: &JournalEntry, done: &crate::store::StoredEvent) {
        let completion = crate::bus::completion_from_json(&done.data);
        let number = |key: &str| done.data.get(key).and_then(serde_json::Value::as_u64);
        let engine = done.data.get("engine").and_then(serde_json::Value::as_str);
        let session_key = session_of(&entry.session_key);
        self.record_session(&session_key, &completion).await;
        let finished = crate::store::FinishedRun {
            run_id: entry.run_id.clone(),
            engine: engine.unwrap_or(&entry.engine).to_owned(),
            completion,
            completed_at_ms: done
                .data
                .get("ts_ms")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or_else(now_ms),
            duration_ms: number("duration_ms").unwrap_or(0),
            spend: crate::budget::usage::RunSpend::default(),
        };
        self.store.finalize_run(finished).await;
        self.runs.remove(&entry.run_id);
        self.journal.complete(&entry.run_id).await;
        self.unfence(&entry.run_id);
    }
}

/// The retry of `original`, as [`retry`] describes it, continuing the session
/// the failed run left.
fn retry_item(original: &Item, run_id: RunId, reason: &str, resume: Option<ResumeToken>) -> Item {
    let mut item = original.clone();
    item.prompt = retry::retry_prompt(&original.run_id, reason, &original.prompt);
    item.meta = retry::retry_meta(&original.meta, &original.run_id, reason);
    item.run_id = run_id;
    if resume.is_some() {
        item.resume = resume;
    }
    item.suppress_phases = false;
    item
}

/// The session a completion is written under when the router no longer holds
/// the run's conversation.
fn completion_session(original: Option<&Item>, run_id: &RunId) -> SessionKey {
    match original {
        Some(item) => item.session_key.clone(),
        None => SessionKey::from(run_id.to_string()),
    }
}

fn meta_json(item: &Item) -> serde_json::Value {
    serde_json::Value::Object(item.meta.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn journal_entry(item: &Item, accepted_at_ms: i64) -> JournalEntry {
    JournalEntry {
        seq: item.seq,
        run_id: item.run_id.clone(),
        session_key: item.session_key.clone(),
        conversation: item.conversation.to_string(),
        prompt: item.prompt.clone(),
        engine: item.engine.to_string(),
        resume: item.resume.clone(),
        cwd: item.cwd.clone(),
        meta: meta_json(item),
        route: JournalRoute {
            origin: Some(item.origin.as_str().to_owned()),
            queue_mode: Some(item.mode.as_str().to_owned()),
            auto_resume: item.route.auto_resume,
            chosen_engine: item.route.chosen_engine.as_ref().map(ToString::to_string),
            fallback_engine: Some(item.route.fallback_engine.to_string()),
            model: item.model.as_ref().map(ToString::to_string),
            no_auto_resume: Some(item.flags.no_auto_resume),
            goal_continuation: Some(item.flags.goal_continuation),
            auto_followup: Some(item.flags.auto_followup),
        },
        state: JournalState::Queued,
        accepted_at_ms,
    }
}

/// The item a journal entry holds; `Err` with the text of an engine reference
/// that does not parse.
fn item_from_entry(entry: JournalEntry) -> Result<Item, String> {
    let route = entry.route;
    let meta = entry.meta.as_object().map(|m| m.clone().into_iter().collect()).unwrap_or_default();
    // A journal written before the router kept its own flags has them in `meta`.
    let legacy = RequestFlags::from_meta(&meta);
    let flags = RequestFlags {
        no_auto_resume: route.no_auto_resume.unwrap_or(legacy.no_auto_resume),
        goal_continuation: route.goal_continuation.unwrap_or(legacy.goal_continuation),
        auto_followup: route.auto_followup.unwrap_or(legacy.auto_followup),
        // Journaled ids are looked up like any other when submitted again.
        fresh_run_id: false,
        // A recovered request's timing starts again: its first life's stamps were not kept.
        received_at_us: None,
        delivers: false,
    };
    let model = route.model.clone().or_else(|| model_from_meta(&meta));
    let engine_ref = |raw: &str| EngineRef::parse(raw).map_err(|_| raw.to_owned());
    let engine = engine_ref(&entry.engine)?;
    let chosen_engine = route.chosen_engine.as_deref().map(engine_ref).transpose()?;
    let fallback_engine = match &route.fallback_engine {
        Some(raw) => engine_ref(raw)?,
        None => engine.clone(),
    };
    // A model the router accepted before; one that no longer passes is dropped.
    let model = model.and_then(|m| Model::parse(&m).ok());
    Ok(Item {
        conversation: parse_conversation(&entry.conversation)
            .unwrap_or_else(|| ConversationKey::session(&entry.session_key)),
        session_key: session_of(&entry.session_key),
        run_id: entry.run_id,
        prompt: entry.prompt,
        route: RouteChoice { auto_resume: route.auto_resume, chosen_engine, fallback_engine },
        engine,
        resume: entry.resume,
        cwd: entry.cwd,
        model,
        flags,
        meta,
        origin: route.origin.as_deref().and_then(Origin::parse).unwrap_or(Origin::Internal),
        // Recovered requests keep their order: nothing merges, steers or interrupts.
        mode: QueueMode::Collect,
        seq: entry.seq,
        suppress_phases: false,
        budget: None,
    })
}

/// `/status`'s line on money: what the session spent today (UTC) and the
/// limits in force.
fn spend_today_line(budget: &crate::budget::store_guard::SessionBudget) -> String {
    use crate::budget::store_guard::usd_text;
    let today = &budget.session_today;
    let mut line = format!(
        "Today (UTC): {} tokens, {} in {} run{}.",
        today.spend.tokens(),
        usd_text(today.spend.usd),
        today.runs,
        if today.runs == 1 { "" } else { "s" }
    );
    let limits = &budget.limits;
    let tokens = |n: Option<u64>| n.map(|n| format!("{n} tokens"));
    let listed: Vec<String> = [
        ("run", tokens(limits.session.run_tokens)),
        ("run", limits.session.run_usd.map(usd_text)),
        ("session per day", tokens(limits.session.session_daily_tokens)),
        ("session per day", limits.session.session_daily_usd.map(usd_text)),
        ("day, all sessions", tokens(limits.daily_tokens)),
        ("day, all sessions", limits.daily_usd.map(usd_text)),
    ]
    .into_iter()
    .filter_map(|(scope, limit)| Some(format!("{} per {scope}", limit?)))
    .collect();
    if listed.is_empty() {
        line.push_str(" No limits.");
    } else {
        line.push_str(&format!(" Limits: {}.", listed.join(", ")));
    }
    line
}

/// What the router stamps of a request it journaled: when it arrived, where
/// from, and whether a channel delivers its answer.
struct Arrival {
    received_at_us: Option<i64>,
    channel: String,
    delivers: bool,
}

impl Arrival {
    fn of(req: &RunRequest) -> Self {
        let channel = match (&req.channel, req.origin) {
            (Some(channel), _) => channel.transport.clone(),
            (None, Origin::ControlPlane) => "api".to_owned(),
            (None, origin) => origin.as_str().to_owned(),
        };
        Arrival { received_at_us: req.flags.received_at_us, channel, delivers: req.flags.delivers }
    }

    /// Stamps `received` and `journaled` (now).
    fn stamp(&self, bus: &EventBus, run_id: &RunId, engine: &EngineRef) {
        let timings = bus.timings();
        let now = crate::timing::now_us();
        timings.describe(run_id, &self.channel, engine.id().as_str(), self.delivers);
        timings.stamp_at(run_id, Stage::Received, self.received_at_us.unwrap_or(now).min(now));
        timings.stamp_at(run_id, Stage::Journaled, now);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn item(flags: RequestFlags, model: Option<&str>) -> Item {
        Item {
            run_id: RunId::parse("r1").unwrap(),
            session_key: "s".into(),
            conversation: ConversationKey::session("s"),
            prompt: "p".to_owned(),
            engine: "fake".parse().unwrap(),
            resume: None,
            cwd: None,
            model: model.map(|m| Model::parse(m).unwrap()),
            flags,
            meta: BTreeMap::new(),
            origin: Origin::Cron,
            mode: QueueMode::Followup,
            seq: 1,
            suppress_phases: false,
            route: RouteChoice {
                auto_resume: false,
                chosen_engine: None,
                fallback_engine: "fake".parse().unwrap(),
            },
            budget: None,
        }
    }

    #[test]
    fn a_journaled_request_keeps_its_flags_and_model() {
        let flags = RequestFlags {
            no_auto_resume: true,
            goal_continuation: true,
            auto_followup: true,
            fresh_run_id: false,
            received_at_us: None,
            delivers: false,
        };
        let recovered = item_from_entry(journal_entry(&item(flags, Some("opus")), 0)).unwrap();
        assert_eq!((recovered.flags, recovered.model.as_deref()), (flags, Some("opus")));
        let plain =
            item_from_entry(journal_entry(&item(RequestFlags::default(), None), 0)).unwrap();
        assert_eq!((plain.flags, plain.model), (RequestFlags::default(), None));
    }

    #[test]
    fn a_journal_of_an_older_version_has_the_flags_in_meta() {
        let mut entry = journal_entry(&item(RequestFlags::default(), None), 0);
        entry.route = JournalRoute {
            origin: Some("cron".to_owned()),
            queue_mode: Some("followup".to_owned()),
            ..JournalRoute::default()
        };
        entry.meta = serde_json::json!({ "goal_continuation": true, "model": "opus" });
        let recovered = item_from_entry(entry).unwrap();
        assert!(recovered.flags.goal_continuation);
        assert!(!recovered.flags.auto_followup);
        assert_eq!(recovered.model.as_deref(), Some("opus"));
    }
}
