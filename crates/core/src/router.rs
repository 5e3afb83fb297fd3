//! The router: every message from every channel goes through it. It knows what
//! each conversation is doing and decides what to submit to the gateway and when.
//!
//! [`RouterHandle::submit`] resolves a [`RunRequest`] (slash commands, explicit
//! resume lines, engine directives, bindings, auto-resume from chat state, the
//! queue mode), journals it, gives it a run id and hands it to its conversation.
//! A conversation (`resume:<engine>:<token>` or `session:<key>`) exists while it
//! has work and holds at most one run at the gateway; everything else waits in the
//! router's queue, where the queue modes act on it (see [`queue`]). When the
//! active run completes the router writes chat state, and submits the next item.
//!
//! One actor owns every conversation. It never waits on a run: a small watcher
//! task per dispatched run follows the run ([`RunFollower`]: phases, idle
//! watchdog) and reports the completion back, and steers are delivered by short tasks that
//! report the engine's answer back. Every request the router accepts ends in
//! exactly one `run_completed`: from the gateway when it ran, from the router when
//! it was dropped, merged, cancelled while queued, or steered into another run.

mod actor;
mod follow;
mod journal;
mod query;
pub mod queue;
pub mod resolve;
mod watch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::{EventBus, Subscription};
use crate::cluster::node::remote::{ControlHandler, RemoteAnswer};
use crate::cluster::{ClusterNode, Notice, Topic};
use crate::config::{GatewayConfig, QueueMode};
use crate::engine::{Field, InvalidValue, ResumeToken, RunError, SteerError};
use crate::gateway::{CancelOutcome, GatewayHandle};
use crate::ids::{ConversationKey, EngineRef, RunId, SessionKey};
use crate::store::{ChatState, StoreError, StoreHandle};

use actor::{Admitted, Router, RouterMsg};
pub use follow::{Followed, RunFollower};
pub use query::{EngineInfo, Runs};
pub use queue::Limits;
pub use resolve::matching_bindings;
pub use resolve::SlashCommand;

/// Where a request came from. Channel, webhook and control-plane messages are
/// "user" messages: in `collect` mode they go ahead of queued goal continuations.
/// The journal keeps the origin by name ([`Origin::as_str`]), so recovered
/// requests keep theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// A chat channel (Telegram, SMS, …).
    Channel,
    /// The control API.
    ControlPlane,
    /// A generic inbound webhook (`POST /webhooks/{integration}`).
    Webhook,
    Cron,
    /// The gateway itself (goal continuations, recovered requests of unknown origin).
    Internal,
}

impl Origin {
    /// Every origin, for exhaustive tests.
    pub const ALL: [Origin; 5] =
        [Origin::Channel, Origin::ControlPlane, Origin::Webhook, Origin::Cron, Origin::Internal];

    /// The stable name, as journaled and as `meta.origin`.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Channel => "channel",
            Origin::ControlPlane => "control_plane",
            Origin::Webhook => "webhook",
            Origin::Cron => "cron",
            Origin::Internal => "internal",
        }
    }

    /// The origin named `raw` ([`Origin::as_str`]'s inverse).
    pub fn parse(raw: &str) -> Option<Self> {
        Some(match raw {
            "channel" => Origin::Channel,
            "control_plane" => Origin::ControlPlane,
            "webhook" => Origin::Webhook,
            "cron" => Origin::Cron,
            "internal" => Origin::Internal,
            _ => return None,
        })
    }

    /// Whether a person (or a service acting for one) sent it, as opposed to the
    /// gateway's own scheduling.
    pub fn is_user(self) -> bool {
        match self {
            Origin::Channel | Origin::ControlPlane | Origin::Webhook => true,
            Origin::Cron | Origin::Internal => false,
        }
    }
}

/// The chat a channel message came from, for `[[gateway.bindings]]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChannelRef {
    pub transport: String,
    pub chat_id: Option<String>,
    pub topic_id: Option<String>,
}

impl ChannelRef {
    /// The channel as the router records it in a run's `meta.channel`.
    pub fn to_meta(&self) -> serde_json::Value {
        serde_json::json!({
            "transport": self.transport,
            "chat_id": self.chat_id,
            "topic_id": self.topic_id,
        })
    }

    /// The channel a run's `meta.channel` records.
    pub fn from_meta(value: &serde_json::Value) -> Option<ChannelRef> {
        let text = |key: &str| value.get(key).and_then(serde_json::Value::as_str);
        Some(ChannelRef {
            transport: text("transport")?.to_owned(),
            chat_id: text("chat_id").map(str::to_owned),
            topic_id: text("topic_id").map(str::to_owned),
        })
    }
}

/// Switches of a request that the router acts on. Edges set them; the control
/// API reads them from the request's `meta` keys of the same names, as it always
/// accepted them ([`RequestFlags::from_meta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestFlags {
    /// Start a new session instead of continuing the session's stored one
    /// (`meta.disable_auto_resume`).
    pub no_auto_resume: bool,
    /// A goal's next step: a user's `collect` message goes ahead of it
    /// (`meta.goal_continuation`, in `followup` mode).
    pub goal_continuation: bool,
    /// An engine's own follow-up of a background task or delegated work: never
    /// merged with other followups (`meta.task_auto_followup`,
    /// `meta.delegated_auto_followup`, or a non-empty `meta.async_followups` list).
    pub auto_followup: bool,
    /// The edge made `run_id` itself just now ([`RunId::generate`]), so it names
    /// no earlier run and the router does not look it up in the store. Never set
    /// for an id that came from outside.
    pub fresh_run_id: bool,
    /// When the message reached the channel's edge ([`crate::timing::now_us`]);
    /// `None`: when the router got it.
    pub received_at_us: Option<i64>,
    /// A channel follows the run and delivers its answer, stamping the
    /// `first_visible` and `delivered` stages: its timing closes then rather
    /// than at the completion.
    pub delivers: bool,
}

impl RequestFlags {
    /// The flags named by `meta` keys. A key counts as set when it is `true`, a
    /// non-zero number, or a non-empty string other than `"false"`.
    pub fn from_meta(meta: &BTreeMap<String, serde_json::Value>) -> Self {
        let flag = |key: &str| match meta.get(key) {
            Some(serde_json::Value::Bool(b)) => *b,
            Some(serde_json::Value::String(s)) => !s.is_empty() && s != "false",
            Some(serde_json::Value::Number(n)) => n.as_f64().is_some_and(|n| n != 0.0),
            _ => false,
        };
        let async_followups = meta
            .get("async_followups")
            .and_then(|v| v.as_array())
            .is_some_and(|list| !list.is_empty());
        RequestFlags {
            no_auto_resume: flag("disable_auto_resume"),
            goal_continuation: flag("goal_continuation"),
            auto_followup: flag("task_auto_followup")
                || flag("delegated_auto_followup")
                || async_followups,
            fresh_run_id: false,
            received_at_us: None,
            delivers: false,
        }
    }
}

/// `meta.model` when it is a non-blank string: the model the control API's
/// caller asks for.
pub fn model_from_meta(meta: &BTreeMap<String, serde_json::Value>) -> Option<String> {
    let model = meta.get("model")?.as_str()?.trim();
    (!model.is_empty()).then(|| model.to_owned())
}

/// A message to run, as a transport hands it over.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub origin: Origin,
    /// Blank means the `default` session.
    pub session_key: SessionKey,
    pub agent_id: Option<String>,
    pub prompt: String,
    /// `None`: the binding's mode, then `[gateway.queue] mode`, then `collect`.
    pub queue_mode: Option<QueueMode>,
    /// An engine the caller asks for (possibly composite), parsed where it entered.
    pub engine: Option<EngineRef>,
    /// A structured token to continue; a resume line in the prompt works too.
    pub resume: Option<ResumeToken>,
    pub cwd: Option<PathBuf>,
    /// The model to run with, unless the engine names one (`claude:opus`).
    pub model: Option<String>,
    pub flags: RequestFlags,
    /// Free-form metadata, kept with the run; the router reads none of it,
    /// and narrows its tool filter ([`crate::mcp::META_KEY`]) by the run's
    /// project and binding.
    pub meta: BTreeMap<String, serde_json::Value>,
    /// A caller-chosen id; submitting the same id twice is one run.
    pub run_id: Option<RunId>,
    pub channel: Option<ChannelRef>,
}

impl RunRequest {
    /// A control-plane request with no extras.
    pub fn new(session_key: impl Into<SessionKey>, prompt: impl Into<String>) -> Self {
        RunRequest {
            origin: Origin::ControlPlane,
            session_key: session_key.into(),
            agent_id: None,
            prompt: prompt.into(),
            queue_mode: None,
            engine: None,
            resume: None,
            cwd: None,
            model: None,
            flags: RequestFlags::default(),
            meta: BTreeMap::new(),
            run_id: None,
            channel: None,
        }
    }
}

/// What became of a submitted message.
#[derive(Debug)]
pub enum Submitted {
    /// Accepted as a run; it ends in exactly one `run_completed`, which the
    /// follower yields last. Dropping the follower does not affect the run.
    Run(Accepted, RunFollower),
    /// A slash command the router answered itself; nothing runs.
    Command { command: SlashCommand, reply: String },
}

/// An accepted run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub run_id: RunId,
    pub session_key: SessionKey,
    pub conversation: ConversationKey,
    pub engine: EngineRef,
    /// The id was already known: this is the earlier request, nothing new was queued.
    pub duplicate: bool,
}

/// Why a message was not accepted. Nothing was journaled and no event published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("the router is shutting down")]
    ShuttingDown,
    /// No engine with that id; `known` lists the ids there are, sorted.
    #[error("unknown engine {engine:?}; the engines are {}", known.join(", "))]
    UnknownEngine { engine: String, known: Vec<String> },
    #[error("{message}")]
    UnsupportedResumeEngine { engine: String, message: String },
    /// A value of the request does not have the shape its engine accepts (a
    /// resume token, a model name), so it could be read as an option by a CLI.
    /// `what` is a short lowercase phrase such as "invalid resume token for claude".
    #[error("{field}: {what} ({why})")]
    Invalid { field: Field, what: String, why: InvalidValue },
    /// The gateway refused the request (overloaded, shutting down…).
    #[error(transparent)]
    Refused(#[from] crate::gateway::SubmitError),
    #[error("the request could not be journaled: {0}")]
    Journal(#[from] StoreError),
    /// A caller's run id names an earlier request with another prompt, engine or
    /// session.
    #[error("run_id {run_id} already used for another request")]
    RunIdConflict { run_id: String },
    /// The working directory is outside `[gateway] allowed_cwd_roots`.
    #[error("cwd {cwd} is outside allowed_cwd_roots")]
    CwdNotAllowed { cwd: String },
    /// The conversation already has `[gateway.queue] cap` requests waiting and
    /// no `drop` policy: nothing was accepted; try again once one has run.
    #[error("this conversation already has {cap} requests waiting; try again once one has run")]
    QueueFull { cap: usize },
}

impl RouteError {
    /// The error as a short reply in a chat: a refused value reads
    /// `Invalid resume token for claude.`, anything else `Not accepted: <error>`.
    pub fn chat_reply(&self) -> String {
        match self {
            RouteError::Invalid { what, .. } => sentence(what),
            other => format!("Not accepted: {other}"),
        }
    }
}

/// `invalid model for claude` → `Invalid model for claude.`
fn sentence(phrase: &str) -> String {
    let mut chars = phrase.chars();
    match chars.next() {
        Some(first) => format!("{}{}.", first.to_uppercase(), chars.as_str()),
        None => String::new(),
    }
}

/// What a conversation-wide cancel or abort did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CancelSummary {
    /// Queued or in-flight requests dropped (each completed as aborted).
    pub dropped: usize,
    /// Active runs asked to stop.
    pub cancelled: usize,
}

/// A session as `/status` and `GET /v1/sessions/{key}` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionView {
    pub session_key: SessionKey,
    /// Active runs of the session (one per conversation it has).
    pub active: Vec<RunId>,
    /// Queued run ids, in the order they will run.
    pub queued: Vec<RunId>,
    /// Steers waiting for the engine's answer.
    pub pending_steers: usize,
    pub chat_state: Option<ChatState>,
    /// The engine chosen with `/engine`.
    pub sticky_engine: Option<EngineRef>,
}

/// The router's settings, from `[gateway]`.
#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub default_engine: EngineRef,
    pub native_only: bool,
    pub queue_mode: Option<QueueMode>,
    pub limits: Limits,
    /// Cancels a run with no event for this long; `None` disables it.
    pub idle_watchdog: Option<Duration>,
    /// Requests recovered from the journal that were accepted longer ago than
    /// this complete `expired` instead of running.
    pub recovered_max_age: Duration,
    /// Bindings and projects, for `ChannelRef` lookups.
    pub gateway: Arc<GatewayConfig>,
}

/// The idle watchdog's default: two hours.
pub const DEFAULT_IDLE_WATCHDOG: Duration = Duration::from_secs(2 * 60 * 60);

impl RouterConfig {
    /// The router's view of `[gateway]`; `run_idle_watchdog_ms = 0` disables the watchdog.
    pub fn from_gateway(gateway: &GatewayConfig) -> Self {
        let idle_watchdog = match gateway.run_idle_watchdog_ms {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => Some(DEFAULT_IDLE_WATCHDOG),
        };
        RouterConfig {
            default_engine: gateway
                .default_engine
                .clone()
                .unwrap_or_else(crate::config::fallback_engine),
            native_only: gateway.native_only.unwrap_or(false),
            queue_mode: gateway.queue.mode,
            limits: Limits { cap: gateway.queue.cap, drop: gateway.queue.drop },
            idle_watchdog,
            recovered_max_age: Duration::from_millis(gateway.recovered_max_age_ms),
            gateway: Arc::new(gateway.clone()),
        }
    }
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig::from_gateway(&GatewayConfig::default())
    }
}

/// What recovery found in the journal after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recovered {
    /// Requests that never started, queued again in their original order.
    pub requeued: usize,
    /// Requests that were running, completed as `interrupted`.
    pub interrupted: usize,
    /// Requests that waited longer than `recovered_max_age_ms`, completed `expired`.
    pub expired: usize,
}

/// The handle to the router. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RouterHandle {
    tx: mpsc::Sender<RouterMsg>,
    gateway: GatewayHandle,
    bus: EventBus,
    store: StoreHandle,
}

impl RouterHandle {
    /// Starts the router over `gateway` on `tracker`; it stops when `token` is
    /// cancelled. Before it takes any request it recovers the journal: requests a
    /// crash left behind are queued again or completed as interrupted.
    pub fn start(
        config: RouterConfig,
        gateway: GatewayHandle,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        if let Some(node) = gateway.cluster() {
            tracker.spawn(cluster_pump(node.clone(), tx.clone(), token.clone()));
        }
        let router = Router::new(config, gateway.clone(), rx, tx.clone(), token, tracker.clone());
        tracker.spawn(router.run());
        let (bus, store) = (gateway.bus().clone(), gateway.store().clone());
        RouterHandle { tx, gateway, bus, store }
    }

    async fn ask<T>(
        &self,
        msg: impl FnOnce(oneshot::Sender<T>) -> RouterMsg,
    ) -> Result<T, RouteError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(msg(reply)).await.map_err(|_| RouteError::ShuttingDown)?;
        rx.await.map_err(|_| RouteError::ShuttingDown)
    }

    /// Accepts a message: a slash command is answered, anything else is
    /// journaled, gets a run id and is queued in its conversation. An accepted
    /// run comes with its follower: every event of the run, ending with its
    /// completion.
    ///
    /// # Errors
    /// [`RouteError`] when the message was not accepted.
    ///
    /// # Cancel safety
    /// Not cancel safe: a cancelled call may or may not have accepted the request.
    pub async fn submit(&self, req: RunRequest) -> Result<Submitted, RouteError> {
        // With a caller's id the run's topic is taken before the run exists, so
        // a new run's events all arrive live and nothing needs reading back.
        let early = req.run_id.as_ref().map(|run_id| self.bus.subscribe_run(run_id));
        let admitted = self.ask(|reply| RouterMsg::Submit { req: Box::new(req), reply }).await??;
        Ok(match admitted {
            Admitted::Run(accepted) => {
                let fresh = early.is_some() && !accepted.duplicate;
                let live = early.unwrap_or_else(|| self.bus.subscribe_run(&accepted.run_id));
                let follower = self.follower(accepted.run_id.clone(), live, fresh);
                Submitted::Run(accepted, follower)
            }
            Admitted::Command { command, reply } => Submitted::Command { command, reply },
        })
    }

    /// The directory a run from `channel` would work in now: its binding's
    /// project, else the default, as the run would choose it. Channels use it
    /// for `/file get` and `/file put`.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`], or [`RouteError::CwdNotAllowed`] when no
    /// directory is allowed.
    pub async fn run_dir(&self, channel: Option<&ChannelRef>) -> Result<PathBuf, RouteError> {
        let requested = match channel {
            Some(channel) => {
                let channel = channel.clone();
                self.ask(|reply| RouterMsg::BindingDir { channel, reply }).await?
            }
            None => None,
        };
        let shown = requested.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        match self.gateway.run_dir(requested).await {
            Ok(Ok(dir)) => Ok(dir),
            Ok(Err(_)) => Err(RouteError::CwdNotAllowed { cwd: shown }),
            Err(_) => Err(RouteError::ShuttingDown),
        }
    }

    /// The gateway's own state, which `/file put` and `/file get` in a
    /// [`RouterHandle::run_dir`] keep out of.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`].
    pub async fn off_limits(&self) -> Result<crate::contain::OffLimits, RouteError> {
        self.gateway.off_limits().await.map_err(|_| RouteError::ShuttingDown)
    }

    fn follower(&self, run_id: RunId, live: Subscription, fresh: bool) -> RunFollower {
        RunFollower::new(run_id, live, self.store.clone(), fresh)
            .following_retries(self.bus.clone())
    }

    /// Follows a run from its first stored event to its completion; a run that
    /// already finished yields its stored events and its completion at once. An
    /// unknown run yields nothing until it exists.
    pub fn follow(&self, run_id: &RunId) -> RunFollower {
        self.follower(run_id.clone(), self.bus.subscribe_run(run_id), false)
    }

    /// Every event of every run from now on, phases included (the `/v1/events`
    /// firehose). A subscriber that falls behind is told how many it missed.
    pub fn subscribe_all(&self) -> Subscription {
        self.bus.subscribe_all()
    }

    /// Every `run_started` event from now on, and nothing else: what a channel
    /// watches for runs started elsewhere in its conversations. A subscriber
    /// that falls behind is told how many starts it missed.
    pub fn subscribe_starts(&self) -> Subscription {
        self.bus.subscribe_starts()
    }

    /// Gateway-wide notices that belong to no run (config reloaded or rejected).
    pub fn subscribe_notices(&self) -> tokio::sync::broadcast::Receiver<Arc<crate::bus::Notice>> {
        self.bus.subscribe_notices()
    }

    /// Publishes a gateway-wide notice (a channel's own event, such as a voice
    /// call's `voice_turn` timings) to `/v1/events`; never waits.
    pub fn publish_notice(&self, notice: crate::bus::Notice) {
        self.bus.publish_notice(notice);
    }

    /// The read-only view of runs, sessions, engines and the scheduler.
    pub fn query(&self) -> Runs {
        Runs::new(self.clone())
    }

    /// Pauses intake (`true`) or resumes it: while paused, messages are still
    /// accepted and queued, and no new run starts (see
    /// [`GatewayHandle::set_paused`]); `/v1/status` shows it as `paused`.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the gateway is gone.
    pub async fn set_intake_paused(&self, paused: bool) -> Result<(), RouteError> {
        self.gateway.set_paused(paused).await.map_err(|_| RouteError::ShuttingDown)
    }

    /// Cancels one run: dropped if the router still holds it queued, else
    /// stopped at the gateway. Idempotent; a finished run is
    /// [`CancelOutcome::NotActive`].
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router or the gateway is gone.
    pub async fn cancel_run(&self, run_id: &RunId) -> Result<CancelOutcome, RouteError> {
        let outcome = self.cancel_here(run_id).await?;
        let Some(node) = self.gateway.cluster() else { return Ok(outcome) };
        if outcome != CancelOutcome::NotActive {
            return Ok(outcome);
        }
        // In a cluster the run may belong to a session another node owns.
        let Some(session_key) = self.unfinished_session(run_id).await else { return Ok(outcome) };
        match node.remote_cancel(run_id, session_key.as_str()).await {
            Ok(RemoteAnswer::Done) => Ok(CancelOutcome::Cancelling),
            Ok(_) => Ok(CancelOutcome::NotActive),
            Err(error) => {
                tracing::warn!(%error, %run_id, "cancel not delivered to the run's node");
                Err(RouteError::Journal(StoreError::Database(format!("cluster: {error}"))))
            }
        }
    }

    /// [`RouterHandle::cancel_run`] on this node only.
    async fn cancel_here(&self, run_id: &RunId) -> Result<CancelOutcome, RouteError> {
        if self.abort_run(run_id).await? {
            return Ok(CancelOutcome::Cancelling);
        }
        self.gateway
            .cancel(run_id, RunError::UserRequested)
            .await
            .map_err(|_| RouteError::ShuttingDown)
    }

    /// The session of a run the store has and that has not finished.
    async fn unfinished_session(&self, run_id: &RunId) -> Option<SessionKey> {
        match self.store.get_run(run_id.as_str()).await {
            Ok(Some(record)) if !record.status.is_terminal() => Some(record.session_key),
            _ => None,
        }
    }

    /// Sends more input into a running run, on whichever node of a cluster runs it.
    ///
    /// # Errors
    /// [`SteerError`] when the run is not running or its engine refused.
    pub async fn steer(&self, run_id: &RunId, text: &str) -> Result<(), SteerError> {
        let here = self.gateway.steer(run_id, text).await;
        let Some(node) = self.gateway.cluster() else { return here };
        if !matches!(here, Err(SteerError::Finished)) {
            return here;
        }
        let Some(session_key) = self.unfinished_session(run_id).await else { return here };
        match node.remote_steer(run_id, session_key.as_str(), text).await {
            Ok(RemoteAnswer::Done) => Ok(()),
            Ok(RemoteAnswer::NotActive) => Err(SteerError::Finished),
            Ok(RemoteAnswer::Refused(why)) => Err(SteerError::Failed(why)),
            Err(error) => {
                Err(SteerError::Failed(format!("the run's node did not answer: {error}")))
            }
        }
    }

    /// Cancels a conversation: drops its queue and in-flight steers, cancels its run.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn cancel_conversation(
        &self,
        key: &ConversationKey,
    ) -> Result<CancelSummary, RouteError> {
        self.ask(|reply| RouterMsg::CancelConversation { key: key.clone(), reply }).await
    }

    /// Cancels the session's active runs; queued work stays and runs next.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn cancel_session(
        &self,
        session_key: &SessionKey,
    ) -> Result<CancelSummary, RouteError> {
        self.ask(|reply| RouterMsg::CancelSession { session_key: session_key.clone(), reply }).await
    }

    /// Drops the session's queued work and cancels its active runs.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn abort_session(
        &self,
        session_key: &SessionKey,
    ) -> Result<CancelSummary, RouteError> {
        self.ask(|reply| RouterMsg::AbortSession { session_key: session_key.clone(), reply }).await
    }

    /// Drops (queued or in flight) or cancels (active) one run. `false` when the
    /// router holds no such run.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn abort_run(&self, run_id: &RunId) -> Result<bool, RouteError> {
        self.ask(|reply| RouterMsg::AbortRun { run_id: run_id.clone(), reply }).await
    }

    /// The session's active runs, queue and chat state.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn session(&self, session_key: &SessionKey) -> Result<SessionView, RouteError> {
        self.ask(|reply| RouterMsg::Session { session_key: session_key.clone(), reply }).await
    }

    /// How many requests wait in the router's queue of each session that has
    /// any (behind the session's active run), in no order.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn session_queues(&self) -> Result<Vec<(SessionKey, usize)>, RouteError> {
        self.ask(|reply| RouterMsg::SessionQueues { reply }).await
    }

    /// Puts a new generation of the settings in force (default engine, bindings,
    /// projects, queue defaults, the idle watchdog): requests accepted from now
    /// on use it; runs already dispatched keep their watchdog.
    ///
    /// # Errors
    /// [`RouteError::ShuttingDown`] when the router is gone.
    pub async fn reload(&self, config: RouterConfig) -> Result<(), RouteError> {
        let msg = RouterMsg::Reload { config: Box::new(config) };
        self.tx.send(msg).await.map_err(|_| RouteError::ShuttingDown)
    }
}

/// A cluster node's router hears about handed-off requests from the
/// notifications, and sweeps every `sweep` interval and after a notification
/// may have been missed.
async fn cluster_pump(
    node: Arc<ClusterNode>,
    tx: mpsc::Sender<RouterMsg>,
    token: CancellationToken,
) {
    use tokio::sync::broadcast::error::RecvError;
    let mut notices = node.subscribe();
    let mut tick = tokio::time::interval(node.settings().sweep);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let msg = tokio::select! {
            biased;
            () = token.cancelled() => return,
            notice = notices.recv() => match notice {
                Ok(Notice::Notified { topic: Topic::Handoff, payload }) => {
                    match node.handoff_for_me(&payload) {
                        Some(session_key) => RouterMsg::Adopt { session_key },
                        None => continue,
                    }
                }
                Ok(Notice::Resync) | Err(RecvError::Lagged(_)) => RouterMsg::Sweep,
                Ok(Notice::Notified { .. }) => continue,
                Err(RecvError::Closed) => return,
            },
            _ = tick.tick() => RouterMsg::Sweep,
        };
        // A sweep the router has not got to yet covers this one too.
        let sent = match msg {
            RouterMsg::Sweep => match tx.try_send(msg) {
                Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
                _ => Ok(()),
            },
            other => tx.send(other).await.map_err(drop),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// How a node acts on a cancel or steer another node sent it.
#[async_trait::async_trait]
impl ControlHandler for RouterHandle {
    async fn cancel(&self, run_id: &RunId) -> RemoteAnswer {
        match self.cancel_here(run_id).await {
            Ok(CancelOutcome::NotActive) => RemoteAnswer::NotActive,
            Ok(_) => RemoteAnswer::Done,
            Err(error) => RemoteAnswer::Refused(error.to_string()),
        }
    }

    async fn steer(&self, run_id: &RunId, text: &str) -> RemoteAnswer {
        match self.gateway.steer(run_id, text).await {
            Ok(()) => RemoteAnswer::Done,
            Err(SteerError::Finished) => RemoteAnswer::NotActive,
            Err(error) => RemoteAnswer::Refused(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
