//! The relay a vendor CLI asks through: Claude Code calls a permission tool
//! (`--permission-prompt-tool`) on the gateway's MCP endpoint for every call
//! it would ask a person about, and the endpoint asks the [`Gate`].
//!
//! - A run registers before its CLI starts and gets a token of its own
//!   ([`Registration`], withdrawn when it is dropped); the endpoint answers
//!   only a known token, and a token names one run.
//! - The gate judges the call by the owner's rules (the untrusted rules for
//!   an untrusted run), exactly as a native call: a call no rule matches
//!   runs (the default rules end with `tool = "*"`, `action = "ask"`).
//! - An asked call is put up in the [`ApprovalHub`] and shows as an
//!   `approval` action in the run's events, like a native call's, so every
//!   surface that answers native requests answers it too.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{ApprovalHub, ApprovalRequest, Rules, RunScope};
use crate::config::ApprovalAction;
use crate::engine::{EngineEvent, EventSink};

/// What the gate says about a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Not run; what the model is told.
    Deny(String),
}

/// The gate: the policies, the hub, and the runs that may ask.
#[derive(Debug, Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    rules: Rules,
    hub: ApprovalHub,
    runs: Mutex<HashMap<String, Arc<GatedRun>>>,
    /// The MCP endpoint's URL, once the API listens.
    url: OnceLock<String>,
}

/// A run that may ask.
#[derive(Debug)]
struct GatedRun {
    run_id: String,
    session_key: String,
    engine: String,
    cwd: PathBuf,
    untrusted: Option<String>,
    meta: BTreeMap<String, Value>,
    sink: EventSink,
    asking: Arc<AtomicUsize>,
    /// Cancelled when the registration is dropped: calls of the run still
    /// going stop.
    ended: CancellationToken,
}

impl GatedRun {
    fn scope(&self) -> RunScope<'_> {
        RunScope {
            untrusted: self.untrusted.is_some(),
            engine: &self.engine,
            cwd: &self.cwd,
            meta: &self.meta,
        }
    }
}

/// What a run registers with.
#[derive(Debug)]
pub struct RunTicket {
    pub run_id: String,
    pub session_key: String,
    /// The engine's id: its `[gateway.approvals.engines]` rules apply.
    pub engine: String,
    pub cwd: PathBuf,
    /// The run's meta: where its text came from ([`crate::untrusted`]) and
    /// the channel that picks its binding's rules.
    pub meta: BTreeMap<String, Value>,
    /// The run's events: the approval actions go here.
    pub sink: EventSink,
}

/// A run's registration: its token, and how many of its calls wait for an
/// answer now (the CLI prints nothing meanwhile, and its inactivity timer
/// must not run). Dropping it withdraws the token.
#[derive(Debug)]
pub struct Registration {
    gate: Gate,
    pub token: String,
    pub asking: Arc<AtomicUsize>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let run = self.gate.lock().remove(&self.token);
        if let Some(run) = run {
            run.ended.cancel();
        }
    }
}

/// The run a token names, as [`Gate::run_of`] finds it.
#[derive(Debug, Clone)]
pub struct TokenRun {
    pub run_id: String,
    pub session_key: String,
    pub engine: String,
    pub cwd: PathBuf,
    /// The request's metadata (its channel, its tool filter).
    pub meta: BTreeMap<String, Value>,
}

/// The token is no run's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown or expired run token")]
pub struct UnknownToken;

impl Gate {
    pub fn new(rules: Rules, hub: ApprovalHub) -> Gate {
        Gate {
            inner: Arc::new(Inner {
                rules,
                hub,
                runs: Mutex::new(HashMap::new()),
                url: OnceLock::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<GatedRun>>> {
        self.inner.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets where the MCP endpoint listens (once; later calls change nothing).
    pub fn set_url(&self, url: String) {
        let _ = self.inner.url.set(url);
    }

    /// The MCP endpoint's URL; `None` while the API does not listen (then
    /// CLIs are not pointed at it).
    pub fn url(&self) -> Option<&str> {
        self.inner.url.get().map(String::as_str)
    }

    /// Registers a run; its token until the registration is dropped.
    pub fn register(&self, ticket: RunTicket) -> Registration {
        let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
        let asking = Arc::new(AtomicUsize::new(0));
        let run = GatedRun {
            run_id: ticket.run_id,
            session_key: ticket.session_key,
            engine: ticket.engine,
            cwd: ticket.cwd,
            untrusted: crate::untrusted::source(&ticket.meta),
            meta: ticket.meta,
            sink: ticket.sink,
            asking: asking.clone(),
            ended: CancellationToken::new(),
        };
        self.lock().insert(token.clone(), Arc::new(run));
        Registration { gate: self.clone(), token, asking }
    }

    /// Whether a rule may keep a call of a run where `scope` says from
    /// running: without one, a CLI need not be asked to relay its calls.
    pub fn may_refuse(&self, scope: &RunScope<'_>) -> bool {
        !self.inner.rules.for_scope(scope).is_empty()
    }

    /// Whether `token` is a registered run's.
    pub fn knows(&self, token: &str) -> bool {
        self.lock().contains_key(token)
    }

    /// The run that holds `token`: whose session the gateway's tools act for
    /// when the run calls them over MCP.
    pub fn run_of(&self, token: &str) -> Option<TokenRun> {
        self.lock().get(token).map(|run| TokenRun {
            run_id: run.run_id.clone(),
            session_key: run.session_key.clone(),
            engine: run.engine.clone(),
            cwd: run.cwd.clone(),
            meta: run.meta.clone(),
        })
    }

    /// A token cancelled when the run that holds `token` ends (its
    /// registration is dropped); `None` for a token no run holds.
    pub fn ended(&self, token: &str) -> Option<CancellationToken> {
        self.lock().get(token).map(|run| run.ended.child_token())
    }

    /// Adds `event` to the events of the run that holds `token`, as if its
    /// engine had sent it: a gateway tool called over MCP shows as an action
    /// of the run, and the files its result queues go with the run's answer.
    /// A run no longer listening loses the event.
    ///
    /// # Errors
    /// [`UnknownToken`] for a token no run holds.
    ///
    /// # Cancel safety
    /// Cancel safe: the event is sent or not.
    pub async fn report(&self, token: &str, event: EngineEvent) -> Result<(), UnknownToken> {
        let run = self.lock().get(token).cloned().ok_or(UnknownToken)?;
        let _ = run.sink.send(event).await;
        Ok(())
    }

    /// Judges `tool` called with `input` by the run of `token`: allowed or
    /// denied by a rule at once, else asked and waited for. `call_id` (the
    /// CLI's id of the call) names the approval action.
    ///
    /// # Errors
    /// [`UnknownToken`] for a token no run holds.
    pub async fn decide(
        &self,
        token: &str,
        tool: &str,
        input: &Value,
        call_id: Option<&str>,
    ) -> Result<Decision, UnknownToken> {
        let run = self.lock().get(token).cloned().ok_or(UnknownToken)?;
        let policy = self.inner.rules.for_scope(&run.scope());
        let subject = super::subject(tool, input, &run.cwd);
        let verdict = policy.judge(tool, &subject);
        let rule = verdict.rule_text;
        match verdict.action {
            ApprovalAction::Allow => {
                tracing::info!(run_id = %run.run_id, tool = %crate::log_text::escape(tool), %rule, "vendor tool call allowed by the approval policy");
                Ok(Decision::Allow)
            }
            ApprovalAction::Deny => {
                tracing::info!(run_id = %run.run_id, tool = %crate::log_text::escape(tool), %rule, "vendor tool call denied by the approval policy");
                Ok(Decision::Deny(format!(
                    "The owner's policy denies this call ({rule}); it was not run."
                )))
            }
            ApprovalAction::Ask => {
                if let Some(how) = self.inner.hub.granted(&run.session_key, tool, &subject) {
                    tracing::info!(run_id = %run.run_id, tool = %crate::log_text::escape(tool), %how, "vendor tool call allowed by a standing yes of its session");
                    return Ok(Decision::Allow);
                }
                Ok(self.ask(&run, tool, subject, rule, policy.timeout, call_id).await)
            }
        }
    }

    async fn ask(
        &self,
        run: &GatedRun,
        tool: &str,
        subject: String,
        rule: String,
        timeout: std::time::Duration,
        call_id: Option<&str>,
    ) -> Decision {
        let waiting = self.inner.hub.ask(ApprovalRequest {
            run_id: run.run_id.clone(),
            session_key: run.session_key.clone(),
            tool: tool.to_owned(),
            subject,
            rule,
            untrusted: run.untrusted.clone(),
            timeout,
        });
        let request = waiting.request.clone();
        let action_id = format!("approval_{}", call_id.unwrap_or(&request.id));
        let title = format!("approval: {tool}");
        let asked = super::asked_action(&action_id, &title, &request);
        // A run no longer listening has nobody to answer for it.
        if run.sink.send(EngineEvent::Action(asked)).await.is_err() {
            return Decision::Deny("cancelled".to_owned());
        }
        let outcome = {
            let _asking = Asking::new(&run.asking);
            waiting.outcome().await
        };
        let (done, refusal) = super::settled_action(&action_id, &title, &request, Some(&outcome));
        tracing::info!(
            run_id = %run.run_id,
            tool = %crate::log_text::escape(tool),
            approval = %request.id,
            decision = done.message.as_deref().unwrap_or_default(),
            "approval settled"
        );
        let _ = run.sink.send(EngineEvent::Action(done)).await;
        match refusal {
            None => Decision::Allow,
            Some(message) => Decision::Deny(message),
        }
    }
}

/// Counts a call waiting for its answer while it lives.
struct Asking<'a>(&'a AtomicUsize);

impl<'a> Asking<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Asking(count)
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::config::{ApprovalRuleConfig, ApprovalsConfig};
    use crate::engine::{ActionKind, ActionPhase};

    fn ask_all() -> ApprovalRuleConfig {
        ApprovalRuleConfig { tool: "*".into(), pattern: None, action: ApprovalAction::Ask }
    }

    fn gate(rules: Vec<ApprovalRuleConfig>) -> Gate {
        let config = ApprovalsConfig {
            timeout_ms: 60_000,
            rules: Some(rules),
            ..ApprovalsConfig::default()
        };
        Gate::new(Rules::from_config(&config).unwrap(), ApprovalHub::default())
    }

    fn ticket(sink: EventSink) -> RunTicket {
        RunTicket {
            run_id: "run_1".into(),
            session_key: "agent:main:main".into(),
            engine: "claude".into(),
            cwd: PathBuf::from("/work/proj"),
            meta: BTreeMap::new(),
            sink,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rule_decides_at_once_and_an_asked_call_waits_with_its_events() {
        let rules = vec![
            ApprovalRuleConfig {
                tool: "Bash".into(),
                pattern: Some("rm *".into()),
                action: ApprovalAction::Deny,
            },
            ApprovalRuleConfig {
                tool: "Read".into(),
                pattern: None,
                action: ApprovalAction::Allow,
            },
            ask_all(),
        ];
        let gate = gate(rules);
        let (sink, mut events) = EventSink::channel(8);
        let registration = gate.register(ticket(sink));
        let token = registration.token.clone();
        assert_eq!(token.len(), 64);
        assert!(gate.knows(&token));
        let read = gate.decide(&token, "Read", &json!({ "file_path": "a.txt" }), None).await;
        assert_eq!(read, Ok(Decision::Allow));
        let rm = gate.decide(&token, "Bash", &json!({ "command": "rm -rf /" }), None).await;
        assert!(matches!(rm, Ok(Decision::Deny(ref m)) if m.contains("rm *")), "{rm:?}");

        let asked = {
            let gate = gate.clone();
            let token = token.clone();
            tokio::spawn(async move {
                gate.decide(&token, "Bash", &json!({ "command": "touch x" }), Some("toolu_1")).await
            })
        };
        let Some(EngineEvent::Action(started)) = events.recv().await else { panic!("asked") };
        assert_eq!((started.kind, started.phase), (ActionKind::Approval, ActionPhase::Started));
        assert_eq!(started.id, "approval_toolu_1");
        assert_eq!(started.detail["approval"]["subject"], "touch x");
        assert_eq!(started.detail["approval"]["rule"], "tool = \"*\", action = \"ask\"");
        assert_eq!(registration.asking.load(Ordering::SeqCst), 1, "the run's timer is held");
        let id = started.detail["approval"]["id"].as_str().unwrap().to_owned();
        gate.inner.hub.reply(&id, super::super::Reply::Always, "@ann", "telegram").unwrap();
        assert_eq!(asked.await.unwrap(), Ok(Decision::Allow));
        let Some(EngineEvent::Action(done)) = events.recv().await else { panic!("settled") };
        assert_eq!(done.message.as_deref(), Some("approved for this session by @ann via telegram"));
        assert_eq!(registration.asking.load(Ordering::SeqCst), 0);
        // The standing yes covers the same command, unasked; not another.
        let again = gate.decide(&token, "Bash", &json!({ "command": "touch x" }), None).await;
        assert_eq!(again, Ok(Decision::Allow));
        assert!(events.try_recv().is_err(), "nothing was asked");
        let other = {
            let gate = gate.clone();
            let token = token.clone();
            tokio::spawn(async move {
                gate.decide(&token, "Bash", &json!({ "command": "touch y" }), None).await
            })
        };
        let Some(EngineEvent::Action(asked)) = events.recv().await else { panic!("asked") };
        assert_eq!(asked.detail["approval"]["subject"], "touch y");
        drop(other);

        drop(registration);
        assert!(!gate.knows(&token), "a finished run's token is withdrawn");
        let late = gate.decide(&token, "Bash", &json!({ "command": "ls" }), None).await;
        assert_eq!(late, Err(UnknownToken));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_call_is_denied_when_it_expires() {
        let gate = gate(vec![ask_all()]);
        let (sink, _events) = EventSink::channel(8);
        let registration = gate.register(ticket(sink));
        let decision = tokio::time::timeout(
            Duration::from_secs(120),
            gate.decide(&registration.token, "Write", &json!({ "file_path": "/etc/x" }), None),
        )
        .await
        .expect("expired within its timeout");
        let Ok(Decision::Deny(message)) = decision else { panic!("{decision:?}") };
        assert!(message.starts_with("Nobody answered the approval request within 60 seconds"));
    }
}
