//! The owner's say over tool calls: a policy of ordered rules that allows,
//! asks about or denies each call, and the hub where an asked call waits for
//! its answer.
//!
//! - [`Policy`] judges a call by its tool name and its subject ([`subject`]:
//!   the command line of `bash`, the resolved path of a file tool, the host of
//!   `fetch`, the arguments otherwise); the first rule whose `tool` (any case)
//!   and `match` globs both match decides, and a call no rule matches is
//!   allowed.
//! - [`ApprovalHub`] holds the asked calls until one answer comes (the API,
//!   the command line), the run is cancelled or the request expires; an
//!   answer to a request already answered is refused with what decided it.

mod gate;
mod hub;
#[cfg(test)]
mod tests;

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use globset::{GlobBuilder, GlobMatcher};
use serde_json::{json, Value};

use crate::engine::{Action, ActionKind, ActionPhase};

use crate::config::{ApprovalAction, ApprovalRuleConfig, ApprovalsConfig};

pub use gate::{Decision, Gate, Registration, RunTicket, TokenRun, UnknownToken};
pub use hub::{
    Answer, AnswerError, ApprovalHub, ApprovalRequest, Outcome, PendingApproval, Reply, Waiting,
};

/// Whether `id` has the shape of a request id (`apr_` and 12 lowercase hex
/// digits): anything else from outside is refused before it is looked up or
/// logged.
pub fn is_request_id(id: &str) -> bool {
    id.strip_prefix("apr_").is_some_and(|hex| {
        hex.len() == 12 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The most characters of a call's subject a request shows.
pub const SUBJECT_CHARS: usize = 400;

/// The rules of `[gateway.approvals]`, compiled.
#[derive(Debug, Clone)]
pub struct Policy {
    rules: Vec<Rule>,
    /// How long an asked call waits for its answer before it is denied.
    pub timeout: Duration,
}

#[derive(Debug, Clone)]
struct Rule {
    tool: GlobMatcher,
    pattern: Option<GlobMatcher>,
    action: ApprovalAction,
    /// `tool = "bash", match = "rm *"`, for the request and the log.
    text: String,
}

/// What the policy says about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub action: ApprovalAction,
    /// The deciding rule, numbered from 1 as in the file; `None`: no rule
    /// matched and the call is allowed.
    pub rule: Option<usize>,
    /// The rule as written, or `no rule matched`.
    pub rule_text: String,
}

impl Default for Policy {
    /// No rule: every call is allowed.
    fn default() -> Self {
        Policy { rules: Vec::new(), timeout: Duration::from_millis(600_000) }
    }
}

impl Policy {
    /// Compiles the owner's rules.
    ///
    /// # Errors
    /// The number of the first rule with a glob that does not compile (from
    /// 0, the index in the file), the key and why.
    pub fn from_config(config: &ApprovalsConfig) -> Result<Policy, (usize, &'static str, String)> {
        Policy::compile(&config.owner_rules(), config.timeout_ms, "")
    }

    /// Compiles the rules of untrusted runs (`untrusted`, or its defaults);
    /// each rule's text starts with `untrusted: `, so every surface that
    /// shows a request shows the mark too.
    ///
    /// # Errors
    /// As [`Policy::from_config`], for the `untrusted` list.
    pub fn untrusted_from_config(
        config: &ApprovalsConfig,
    ) -> Result<Policy, (usize, &'static str, String)> {
        Policy::compile(&config.untrusted_rules(), config.timeout_ms, "untrusted: ")
    }

    pub(crate) fn compile(
        config: &[ApprovalRuleConfig],
        timeout_ms: u64,
        label: &str,
    ) -> Result<Policy, (usize, &'static str, String)> {
        // Tool names compare without case: `bash` also names Claude Code's
        // `Bash`. Subjects (paths, command lines) keep their case.
        let compile = |glob: &str, any_case: bool| {
            GlobBuilder::new(glob)
                .literal_separator(false)
                .case_insensitive(any_case)
                .build()
                .map(|glob| glob.compile_matcher())
                .map_err(|err| err.kind().to_string())
        };
        let mut rules = Vec::with_capacity(config.len());
        for (i, rule) in config.iter().enumerate() {
            let tool = compile(&rule.tool, true).map_err(|why| (i, "tool", why))?;
            let pattern = match &rule.pattern {
                Some(pattern) => Some(compile(pattern, false).map_err(|why| (i, "match", why))?),
                None => None,
            };
            let text = match &rule.pattern {
                Some(pattern) => format!(
                    "{label}tool = {:?}, match = {:?}, action = {:?}",
                    rule.tool,
                    pattern,
                    rule.action.as_str()
                ),
                None => {
                    format!("{label}tool = {:?}, action = {:?}", rule.tool, rule.action.as_str())
                }
            };
            rules.push(Rule { tool, pattern, action: rule.action, text });
        }
        Ok(Policy { rules, timeout: Duration::from_millis(timeout_ms) })
    }

    /// Whether there is no rule (every call is allowed).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The first rule that matches `tool` and `subject` decides.
    pub fn judge(&self, tool: &str, subject: &str) -> Verdict {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, rule)| {
                rule.tool.is_match(tool)
                    && rule.pattern.as_ref().is_none_or(|pattern| pattern.is_match(subject))
            })
            .map_or_else(
                || Verdict {
                    action: ApprovalAction::Allow,
                    rule: None,
                    rule_text: "no rule matched".to_owned(),
                },
                |(i, rule)| Verdict {
                    action: rule.action,
                    rule: Some(i + 1),
                    rule_text: rule.text.clone(),
                },
            )
    }
}

/// Where a run stands, beyond its trust: what picks the rules of its
/// engine, project and binding.
#[derive(Debug, Clone, Copy)]
pub struct RunScope<'a> {
    pub untrusted: bool,
    /// The engine's id (`lemon`, `codex`…).
    pub engine: &'a str,
    pub cwd: &'a Path,
    /// The run's `meta` (its `channel`, set by the router, picks the binding).
    pub meta: &'a std::collections::BTreeMap<String, Value>,
}

/// The rules in force, shared by the native engine and the vendor relay: the
/// owner's, the untrusted ones, and the rules of engines, projects and
/// bindings; an accepted config edit replaces them, and a call judged from
/// then on is judged by the new ones.
///
/// A run's policy is its binding's rules (the topic's, then the chat's),
/// then its project's (the binding's project, else the project whose root
/// holds the run's directory), then its engine's, then the owner's (first
/// match wins). An untrusted run takes only the `deny` rules of those scopes
/// before the untrusted rules: a scope can tighten an untrusted run, never
/// loosen it.
#[derive(Debug, Clone)]
pub struct Rules {
    inner: Arc<RwLock<Arc<InForce>>>,
}

#[derive(Debug)]
struct InForce {
    owner: Arc<Policy>,
    untrusted: Arc<Policy>,
    engines: std::collections::BTreeMap<String, Vec<ApprovalRuleConfig>>,
    projects: std::collections::BTreeMap<String, crate::config::ProjectConfig>,
    bindings: Vec<crate::config::BindingConfig>,
}

impl InForce {
    fn compile(
        approvals: &ApprovalsConfig,
        gateway: Option<&crate::config::GatewayConfig>,
    ) -> Result<InForce, (usize, &'static str, String)> {
        Ok(InForce {
            owner: Arc::new(Policy::from_config(approvals)?),
            untrusted: Arc::new(Policy::untrusted_from_config(approvals)?),
            engines: approvals.engines.clone(),
            projects: gateway.map(|g| g.projects.clone()).unwrap_or_default(),
            bindings: gateway.map(|g| g.bindings.clone()).unwrap_or_default(),
        })
    }

    /// The scopes' rule lists that apply to a run, each with its label, most
    /// specific first.
    fn scoped(&self, scope: &RunScope<'_>) -> Vec<(String, &[ApprovalRuleConfig])> {
        let mut out: Vec<(String, &[ApprovalRuleConfig])> = Vec::new();
        let channel = scope.meta.get("channel").and_then(crate::router::ChannelRef::from_meta);
        let (topic, chat) = match &channel {
            Some(channel) => crate::router::matching_bindings(&self.bindings, channel),
            None => (None, None),
        };
        for binding in [topic, chat].into_iter().flatten() {
            if !binding.approvals.is_empty() {
                let place = binding.chat_id_text().unwrap_or_default();
                out.push((format!("binding {}:{place}: ", binding.transport), &binding.approvals));
            }
        }
        let bound = [topic, chat].into_iter().flatten().find_map(|b| b.project.clone());
        let project = match bound {
            Some(id) => self.projects.get_key_value(&id),
            // The deepest root that holds the run's directory.
            None => self
                .projects
                .iter()
                .filter(|(_, project)| scope.cwd.starts_with(&project.root))
                .max_by_key(|(_, project)| project.root.components().count()),
        };
        if let Some((id, project)) = project.filter(|(_, p)| !p.approvals.is_empty()) {
            out.push((format!("project {id:?}: "), &project.approvals));
        }
        if let Some(rules) = self.engines.get(scope.engine).filter(|rules| !rules.is_empty()) {
            out.push((format!("engine {}: ", scope.engine), rules));
        }
        out
    }
}

impl Rules {
    /// The rules of `config` alone (no projects or bindings).
    ///
    /// # Errors
    /// As [`Policy::from_config`] (the config loader checks them first).
    pub fn from_config(config: &ApprovalsConfig) -> Result<Rules, (usize, &'static str, String)> {
        let in_force = InForce::compile(config, None)?;
        Ok(Rules { inner: Arc::new(RwLock::new(Arc::new(in_force))) })
    }

    /// The rules of a gateway's config: `[gateway.approvals]` and the rules
    /// of its projects and bindings.
    ///
    /// # Errors
    /// As [`Policy::from_config`] (the config loader checks them first).
    pub fn from_gateway(
        config: &crate::config::GatewayConfig,
    ) -> Result<Rules, (usize, &'static str, String)> {
        let in_force = InForce::compile(&config.approvals, Some(config))?;
        Ok(Rules { inner: Arc::new(RwLock::new(Arc::new(in_force))) })
    }

    fn current(&self) -> Arc<InForce> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The owner's rules, or the untrusted ones for an untrusted run, with
    /// no scope's rules before them.
    pub fn for_run(&self, untrusted: bool) -> Arc<Policy> {
        let in_force = self.current();
        if untrusted {
            in_force.untrusted.clone()
        } else {
            in_force.owner.clone()
        }
    }

    /// The policy of a run where `scope` says it stands.
    pub fn for_scope(&self, scope: &RunScope<'_>) -> Arc<Policy> {
        let in_force = self.current();
        let base = if scope.untrusted { &in_force.untrusted } else { &in_force.owner };
        let scoped = in_force.scoped(scope);
        if scoped.is_empty() {
            return base.clone();
        }
        let mut rules = Vec::new();
        for (label, list) in scoped {
            let list: Vec<ApprovalRuleConfig> = list
                .iter()
                .filter(|rule| !scope.untrusted || rule.action == ApprovalAction::Deny)
                .cloned()
                .collect();
            match Policy::compile(&list, 0, &label) {
                Ok(policy) => rules.extend(policy.rules),
                Err(_) => {
                    tracing::warn!(scope = %label, "approval rules that do not compile are left out")
                }
            }
        }
        if rules.is_empty() {
            return base.clone();
        }
        rules.extend(base.rules.iter().cloned());
        Arc::new(Policy { rules, timeout: base.timeout })
    }

    /// Puts the rules of `config` in force; rules that do not compile
    /// (refused by the loader before) leave the old ones, said in the log.
    pub fn replace(&self, config: &crate::config::GatewayConfig) {
        match InForce::compile(&config.approvals, Some(config)) {
            Ok(in_force) => {
                *self.inner.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(in_force);
            }
            Err(_) => tracing::warn!("approval rules that do not compile; the old ones stay"),
        }
    }
}

impl Default for Rules {
    /// The default rules ([`ApprovalsConfig::default_rules`] and
    /// [`ApprovalsConfig::default_untrusted`]).
    fn default() -> Self {
        let compiled = Rules::from_config(&ApprovalsConfig::default());
        compiled.unwrap_or_else(|_| unreachable!("the default rules are globs"))
    }
}

/// What a rule's `match` is judged against: the command line of a shell
/// tool (`bash`, Claude's `Bash`); the path of a file tool (`read`, `write`,
/// `edit`, `list`, `grep`, `glob`; Claude's `Read`, `Write`, `Edit`,
/// `MultiEdit`, `NotebookEdit`, `Grep`, `Glob`) joined to `cwd` and
/// normalised; the host of `fetch` or Claude's `WebFetch`; the arguments as
/// compact JSON for any other tool.
pub fn subject(tool: &str, args: &Value, cwd: &Path) -> String {
    let text = |key: &str| args.get(key).and_then(Value::as_str).map(str::to_owned);
    let path = |keys: &[&str]| {
        let path = keys.iter().find_map(|key| text(key)).unwrap_or_else(|| ".".to_owned());
        normalise(&cwd.join(path)).display().to_string()
    };
    match tool {
        "bash" | "Bash" => text("command").unwrap_or_default(),
        "read" | "write" | "edit" | "list" | "grep" | "glob" => path(&["path"]),
        "Read" | "Write" | "Edit" | "MultiEdit" => path(&["file_path"]),
        "NotebookEdit" => path(&["notebook_path"]),
        "Grep" | "Glob" => path(&["path"]),
        "fetch" | "WebFetch" => text("url")
            .map(|url| {
                let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
                let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
                let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
                match host.strip_prefix('[') {
                    Some(v6) => v6.split(']').next().unwrap_or_default().to_owned(),
                    None => host.split(':').next().unwrap_or_default().to_owned(),
                }
            })
            .unwrap_or_default(),
        _ => args.to_string(),
    }
}

/// `path` without `.` and with each `..` taking off the part before it.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// `text` cut to `max` characters, with `…` where it was cut.
pub fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// The approval action a request shows as when it is asked: `id` names it in
/// the run's events, `title` says what asks (`approval: bash`).
pub fn asked_action(id: &str, title: &str, request: &PendingApproval) -> Action {
    Action {
        id: id.to_owned(),
        kind: ActionKind::Approval,
        title: title.to_owned(),
        detail: json!({ "approval": request }),
        phase: ActionPhase::Started,
        ok: None,
        message: Some(request.subject.clone()),
        level: None,
        result_meta: Value::Null,
    }
}

/// The approval action's completion once `outcome` settled the request
/// (`None`: withdrawn, the run ended), and what the model is told when the
/// call does not run (`None`: approved, it runs).
pub fn settled_action(
    id: &str,
    title: &str,
    request: &PendingApproval,
    outcome: Option<&Outcome>,
) -> (Action, Option<String>) {
    let (approved, message, refusal) = match outcome {
        Some(Outcome::Answered(answer)) if answer.approved => {
            let verb = if answer.for_session { "approved for this session" } else { "approved" };
            (true, format!("{verb} by {} via {}", answer.by, answer.via), None)
        }
        Some(Outcome::Answered(answer)) => (
            false,
            format!("denied by {} via {}", answer.by, answer.via),
            Some(format!(
                "The owner denied this call ({} via {}); it was not run.",
                answer.by, answer.via
            )),
        ),
        Some(Outcome::Expired) => {
            let seconds = (request.expires_at_ms - request.requested_at_ms) / 1000;
            (
                false,
                format!("no answer within {seconds} s: denied"),
                Some(format!(
                    "Nobody answered the approval request within {seconds} seconds, so the \
                     call was denied and not run."
                )),
            )
        }
        None => (false, "withdrawn".to_owned(), Some("cancelled".to_owned())),
    };
    let done = Action {
        id: id.to_owned(),
        kind: ActionKind::Approval,
        title: title.to_owned(),
        detail: json!({
            "approval": request,
            "answer": match outcome {
                Some(Outcome::Answered(answer)) => json!(answer),
                Some(Outcome::Expired) => json!({ "expired": true }),
                None => Value::Null,
            },
        }),
        phase: ActionPhase::Completed,
        ok: Some(approved),
        message: Some(message),
        level: None,
        result_meta: Value::Null,
    };
    (done, refusal)
}
