//! Where asked calls wait: one answer each, from whichever surface gives it
//! first; expiry and a cancelled run settle them too.
//!
//! An answer "always for this session" approves the call and leaves a
//! standing yes in its session ([`ApprovalHub::granted`]): the same command,
//! a file under the same directory, the same host, or (for any other tool)
//! any call of the tool is then not asked again until the gateway stops.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

/// How many settled requests are remembered, to tell a late answer what
/// settled its request.
const SETTLED_KEPT: usize = 1_000;
/// Standing yeses kept per session and in all (the oldest go first).
const GRANTS_PER_SESSION: usize = 100;
const SESSIONS_WITH_GRANTS: usize = 1_000;

/// An answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Approve,
    Deny,
    /// Approve, and calls like it in the session run unasked from now on.
    Always,
}

impl Reply {
    pub fn approves(self) -> bool {
        self != Reply::Deny
    }

    /// `approved`, `denied`, `approved for this session`.
    fn verb(self) -> &'static str {
        match self {
            Reply::Approve => "approved",
            Reply::Deny => "denied",
            Reply::Always => "approved for this session",
        }
    }
}

/// A call waiting for its answer, as surfaces show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingApproval {
    pub id: String,
    /// Four digits, unique among the requests waiting: what a reply by text
    /// names (`yes 4821`, `no 4821`) where there are no buttons.
    pub code: String,
    pub run_id: String,
    pub session_key: String,
    pub tool: String,
    /// The command, path or host, cut to [`super::SUBJECT_CHARS`].
    pub subject: String,
    /// The rule that asked.
    pub rule: String,
    /// Where the run's untrusted text came from, when it has some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untrusted: Option<String>,
    pub requested_at_ms: i64,
    pub expires_at_ms: i64,
}

/// What to ask about.
#[derive(Debug, Clone)]
pub struct ApprovalRequest {
    pub run_id: String,
    pub session_key: String,
    pub tool: String,
    pub subject: String,
    pub rule: String,
    /// Where the run's untrusted text came from ([`crate::untrusted`]).
    pub untrusted: Option<String>,
    pub timeout: Duration,
}

/// One answer: who gave it and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Answer {
    pub approved: bool,
    /// Approved for the rest of the session too.
    pub for_session: bool,
    /// `api`, or the user of a chat.
    pub by: String,
    /// The surface: `api`, `cli`, `telegram`…
    pub via: String,
    pub at_ms: i64,
}

/// How an asked call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Answered(Answer),
    /// No answer within the request's timeout: the call is denied.
    Expired,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("no approval request {0}")]
    NotFound(String),
    #[error("approval request {id} was already {settled}")]
    Settled { id: String, settled: String },
}

/// The requests waiting, shared by the engines that ask and the surfaces
/// that answer.
#[derive(Debug, Clone, Default)]
pub struct ApprovalHub {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    pending: BTreeMap<String, Entry>,
    /// Newest last: id and what settled it (`approved by api via api`).
    settled: VecDeque<(String, String)>,
    /// Standing yeses by session key, oldest first; `sessions` is the order
    /// sessions got their first one, for dropping the oldest.
    grants: HashMap<String, Vec<Grant>>,
    sessions: VecDeque<String>,
}

/// A waiting request: what surfaces see, its whole subject (a grant is made
/// from it), and where its answer goes.
#[derive(Debug)]
struct Entry {
    view: PendingApproval,
    subject: String,
    tx: oneshot::Sender<Answer>,
}

/// A session's standing yes for calls like one that was approved.
#[derive(Debug, Clone)]
struct Grant {
    tool: String,
    scope: Scope,
    /// `approved for this session by @ann via telegram`.
    how: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    /// This subject only: a command line, a host.
    Exact(String),
    /// Paths inside this directory.
    Under(String),
    /// Any call of the tool.
    Any,
}

impl Scope {
    /// What a yes to `tool` on `subject` extends to: the same command line
    /// or host, the directory of a file (a directory tool's own directory),
    /// any call of another tool.
    fn of(tool: &str, subject: &str) -> Scope {
        match tool.to_ascii_lowercase().as_str() {
            "bash" | "fetch" | "webfetch" => Scope::Exact(subject.to_owned()),
            "list" | "ls" | "grep" | "glob" => Scope::Under(subject.to_owned()),
            "read" | "write" | "edit" | "multiedit" | "notebookedit" => {
                let dir = std::path::Path::new(subject).parent().map(|p| p.display().to_string());
                Scope::Under(dir.unwrap_or_else(|| subject.to_owned()))
            }
            _ => Scope::Any,
        }
    }

    fn covers(&self, subject: &str) -> bool {
        match self {
            Scope::Exact(exact) => exact == subject,
            Scope::Under(dir) => {
                subject == dir
                    || subject
                        .strip_prefix(dir.as_str())
                        .is_some_and(|rest| rest.starts_with('/') || dir.ends_with('/'))
            }
            Scope::Any => true,
        }
    }
}

impl Inner {
    /// Four random digits no waiting request has.
    fn free_code(&self) -> String {
        loop {
            let n = 1_000 + uuid::Uuid::new_v4().as_u128() % 9_000;
            let code = n.to_string();
            if self.pending.values().all(|entry| entry.view.code != code) {
                return code;
            }
        }
    }

    fn settle(&mut self, id: &str, how: String) {
        if self.settled.len() == SETTLED_KEPT {
            self.settled.pop_front();
        }
        self.settled.push_back((id.to_owned(), how));
    }

    fn grant(&mut self, session_key: &str, grant: Grant) {
        let grants = match self.grants.get_mut(session_key) {
            Some(grants) => grants,
            None => {
                if self.sessions.len() == SESSIONS_WITH_GRANTS {
                    if let Some(oldest) = self.sessions.pop_front() {
                        self.grants.remove(&oldest);
                    }
                }
                self.sessions.push_back(session_key.to_owned());
                self.grants.entry(session_key.to_owned()).or_default()
            }
        };
        if grants.len() == GRANTS_PER_SESSION {
            grants.remove(0);
        }
        grants.push(grant);
    }
}

impl ApprovalHub {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `request` up for an answer; the call waits on the returned
    /// [`Waiting`], and dropping it (the run was cancelled) withdraws it.
    pub fn ask(&self, request: ApprovalRequest) -> Waiting {
        let now = crate::clock::now_ms();
        let timeout_ms = i64::try_from(request.timeout.as_millis()).unwrap_or(i64::MAX / 2);
        let id = format!("apr_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let subject = request.subject.clone();
        let mut view = PendingApproval {
            id: id.clone(),
            code: String::new(),
            run_id: request.run_id,
            session_key: request.session_key,
            tool: request.tool,
            subject: super::shorten(&request.subject, super::SUBJECT_CHARS),
            rule: request.rule,
            untrusted: request.untrusted,
            requested_at_ms: now,
            expires_at_ms: now.saturating_add(timeout_ms),
        };
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        view.code = inner.free_code();
        inner.pending.insert(id, Entry { view: view.clone(), subject, tx });
        drop(inner);
        Waiting { request: view, timeout: request.timeout, rx, hub: self.clone() }
    }

    /// The requests waiting, oldest first.
    pub fn pending(&self) -> Vec<PendingApproval> {
        let mut all: Vec<PendingApproval> =
            self.lock().pending.values().map(|entry| entry.view.clone()).collect();
        all.sort_by_key(|view| view.requested_at_ms);
        all
    }

    /// Answers request `id`.
    ///
    /// # Errors
    /// [`AnswerError::Settled`] with what settled it when it was answered,
    /// expired or withdrawn before; [`AnswerError::NotFound`] for an id
    /// never seen (or settled long ago).
    pub fn answer(
        &self,
        id: &str,
        approved: bool,
        by: &str,
        via: &str,
    ) -> Result<PendingApproval, AnswerError> {
        self.reply(id, if approved { Reply::Approve } else { Reply::Deny }, by, via)
    }

    /// Answers request `id` with `reply`; [`Reply::Always`] also leaves a
    /// standing yes in the request's session.
    ///
    /// # Errors
    /// As [`ApprovalHub::answer`].
    pub fn reply(
        &self,
        id: &str,
        reply: Reply,
        by: &str,
        via: &str,
    ) -> Result<PendingApproval, AnswerError> {
        let mut inner = self.lock();
        let Some(entry) = inner.pending.remove(id) else {
            return Err(match inner.settled.iter().rev().find(|(settled, _)| settled == id) {
                Some((_, how)) => AnswerError::Settled { id: id.to_owned(), settled: how.clone() },
                None => AnswerError::NotFound(id.to_owned()),
            });
        };
        let how = format!("{} by {by} via {via}", reply.verb());
        inner.settle(id, how.clone());
        if reply == Reply::Always {
            let grant = Grant {
                tool: entry.view.tool.to_ascii_lowercase(),
                scope: Scope::of(&entry.view.tool, &entry.subject),
                how,
            };
            inner.grant(&entry.view.session_key, grant);
        }
        let answer = Answer {
            approved: reply.approves(),
            for_session: reply == Reply::Always,
            by: by.to_owned(),
            via: via.to_owned(),
            at_ms: crate::clock::now_ms(),
        };
        // The run may have ended since; then nobody waits and it is settled all the same.
        let _ = entry.tx.send(answer);
        Ok(entry.view)
    }

    /// The standing yes of `session_key` that covers `tool` on `subject`:
    /// how it was given (`approved for this session by @ann via telegram`).
    pub fn granted(&self, session_key: &str, tool: &str, subject: &str) -> Option<String> {
        let inner = self.lock();
        let tool = tool.to_ascii_lowercase();
        inner
            .grants
            .get(session_key)?
            .iter()
            .rev()
            .find(|grant| grant.tool == tool && grant.scope.covers(subject))
            .map(|grant| grant.how.clone())
    }

    /// Answers the request of `session_key` whose code is `code`: a reply
    /// by text (`yes 4821`) in the conversation that was asked.
    ///
    /// # Errors
    /// [`AnswerError::NotFound`] when no request of that conversation with
    /// that code waits (never answered, or settled already).
    pub fn answer_code(
        &self,
        session_key: &str,
        code: &str,
        reply: Reply,
        by: &str,
        via: &str,
    ) -> Result<PendingApproval, AnswerError> {
        let id = self
            .lock()
            .pending
            .values()
            .find(|entry| entry.view.code == code && entry.view.session_key == session_key)
            .map(|entry| entry.view.id.clone());
        match id {
            Some(id) => self.reply(&id, reply, by, via),
            None => Err(AnswerError::NotFound(code.to_owned())),
        }
    }

    fn withdraw(&self, id: &str, how: &str) {
        let mut inner = self.lock();
        if inner.pending.remove(id).is_some() {
            inner.settle(id, how.to_owned());
        }
    }
}

/// An asked call's wait for its answer.
#[derive(Debug)]
pub struct Waiting {
    pub request: PendingApproval,
    timeout: Duration,
    rx: oneshot::Receiver<Answer>,
    hub: ApprovalHub,
}

impl Waiting {
    /// The answer, or [`Outcome::Expired`] after the request's timeout.
    pub async fn outcome(mut self) -> Outcome {
        match tokio::time::timeout(self.timeout, &mut self.rx).await {
            Ok(Ok(answer)) => Outcome::Answered(answer),
            // Timed out, or the hub dropped the sender (cannot happen while
            // the entry is there): denied either way.
            Ok(Err(_)) | Err(_) => {
                self.hub.withdraw(&self.request.id, "expired without an answer");
                Outcome::Expired
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.hub.withdraw(&self.request.id, "withdrawn: the run ended while it waited");
    }
}
