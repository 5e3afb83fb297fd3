//! One conversation's queue semantics as a pure state machine: the router actor
//! feeds it submissions, steer acknowledgements, run ends and cancels, and
//! carries out the [`Effect`]s it returns. Time comes in as an argument, so the
//! followup merge window is tested without a clock.
//!
//! Invariants the actor relies on:
//! - at most one run per conversation is active (submitted to the gateway);
//! - a conversation with no active run has an empty queue (the next item is
//!   dispatched as soon as the active run ends);
//! - every item that leaves the state without being dispatched leaves through an
//!   [`Effect::Complete`], exactly once.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use crate::bus::RunPhase;
use crate::config::{DropPolicy, QueueMode};
use crate::engine::{Completion, ResumeToken, RunError};
use crate::ids::{ConversationKey, EngineRef, Model, RunId, SessionKey};

use super::{Origin, RequestFlags};

/// Two followups closer than this are merged into one turn.
pub const FOLLOWUP_MERGE_WINDOW: Duration = Duration::from_millis(500);

/// An accepted request, resolved and waiting to be dispatched.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub run_id: RunId,
    pub session_key: SessionKey,
    pub conversation: ConversationKey,
    pub prompt: String,
    /// The resolved engine, with its model when composite.
    pub engine: EngineRef,
    pub resume: Option<ResumeToken>,
    pub cwd: Option<PathBuf>,
    pub model: Option<Model>,
    pub flags: RequestFlags,
    pub meta: BTreeMap<String, serde_json::Value>,
    pub origin: Origin,
    /// The mode it was queued in (a steer that fell back is queued as its fallback).
    pub mode: QueueMode,
    /// Acceptance order across the router, kept by a merge; the journal's order.
    pub seq: u64,
    /// Re-queued steers emit no phases: their caller already saw them accepted.
    pub suppress_phases: bool,
    /// How the engine was chosen, so auto-resume can be re-read at dispatch time
    /// (the run ahead of it may have just written a newer session).
    pub route: RouteChoice,
    /// The limits of the binding its channel matched (not journaled: a
    /// recovered request has its session's and the global limits).
    pub budget: Option<crate::config::SessionLimits>,
}

/// The engine choice of an item before chat state was consulted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteChoice {
    /// Continue the session's stored token (no explicit token, not disabled).
    pub auto_resume: bool,
    /// The engine the caller, a directive or `/engine` chose.
    pub chosen_engine: Option<EngineRef>,
    /// The binding's, project's or global engine, used without a stored session.
    pub fallback_engine: EngineRef,
}

impl Item {
    /// Task and delegated auto-followups are never merged and steer a live run.
    pub fn is_async_followup(&self) -> bool {
        self.flags.auto_followup
    }

    fn is_goal_continuation(&self) -> bool {
        self.mode == QueueMode::Followup && self.flags.goal_continuation
    }

    fn phase(&self, phase: RunPhase) -> Option<Effect> {
        (!self.suppress_phases).then(|| Effect::Phase {
            run_id: self.run_id.clone(),
            session_key: self.session_key.clone(),
            phase,
        })
    }
}

/// How a steering mode delivers into a live run, and where it goes if it cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteerKind {
    Steer,
    SteerBacklog,
    Redirect,
}

impl SteerKind {
    pub fn of(mode: QueueMode) -> Option<Self> {
        match mode {
            QueueMode::Steer => Some(SteerKind::Steer),
            QueueMode::SteerBacklog => Some(SteerKind::SteerBacklog),
            QueueMode::Redirect => Some(SteerKind::Redirect),
            _ => None,
        }
    }

    /// The mode a rejected or failed steer is queued in.
    pub fn fallback(self) -> QueueMode {
        match self {
            SteerKind::Steer | SteerKind::Redirect => QueueMode::Followup,
            SteerKind::SteerBacklog => QueueMode::Collect,
        }
    }
}

/// What the actor must do.
// Effects live for one step of the actor and are consumed at once; the
// completion (with its files) is kept inline rather than boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Submit this item to the gateway; it becomes the active run.
    Dispatch(Item),
    /// Cancel the active run at the gateway.
    CancelActive {
        run_id: RunId,
        reason: RunError,
    },
    /// Deliver text into the active run; answer with [`Conversation::steer_result`].
    Steer {
        host: RunId,
        kind: SteerKind,
        run_id: RunId,
        text: String,
    },
    /// The item ends here, without running (dropped, merged, cancelled, steered).
    Complete {
        item: Item,
        completion: Completion,
        engine: String,
    },
    /// The item changed (a merge): rewrite its journal entry.
    Rejournal(Item),
    Phase {
        run_id: RunId,
        session_key: SessionKey,
        phase: RunPhase,
    },
}

/// A steer waiting for the engine's answer.
#[derive(Debug, Clone, PartialEq)]
struct PendingSteer {
    item: Item,
    kind: SteerKind,
    /// Set when a cancel or abort reached it while in flight: it must not be re-queued.
    cancelled: Option<RunError>,
}

/// The run the conversation has at the gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct Active {
    pub run_id: RunId,
    pub session_key: SessionKey,
    pub engine: EngineRef,
    /// A cancel was sent; a second interrupt does not send another.
    cancelling: bool,
    /// Steers the run took; they complete with the run.
    steered: Vec<Item>,
    /// The run ended while steers were in flight: its completion and engine.
    ended: Option<(Completion, String)>,
}

/// Queue limits from `[gateway.queue]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub cap: Option<usize>,
    /// Which waiting request a full queue drops; `None`: none, the router
    /// refuses requests to a full conversation before accepting them.
    pub drop: Option<DropPolicy>,
}

impl Limits {
    /// Whether a new request to `conversation` must be refused: it is full
    /// and drops nothing.
    pub fn refuses(&self, conversation: &Conversation) -> bool {
        self.drop.is_none() && self.cap.is_some_and(|cap| conversation.waiting() >= cap)
    }
}

/// One conversation: its active run, its queue and its in-flight steers.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Conversation {
    active: Option<Active>,
    queue: VecDeque<Item>,
    last_followup_at: Option<Instant>,
    pending: Vec<PendingSteer>,
}

fn aborted(reason: RunError) -> Completion {
    Completion::failure(reason, None)
}

/// Narrows the tool filter of `merged` by every list of `earlier`'s it does
/// not have yet (an unreadable filter narrows it to no tool).
fn keep_tool_filter(
    earlier: &BTreeMap<String, serde_json::Value>,
    merged: &mut BTreeMap<String, serde_json::Value>,
) {
    use crate::mcp::ToolFilter;
    let earlier = ToolFilter::from_meta(earlier);
    for list in earlier.lists() {
        if !ToolFilter::from_meta(merged).lists().contains(list) {
            ToolFilter::narrow_meta(merged, list);
        }
    }
}

impl Conversation {
    pub fn active(&self) -> Option<&Active> {
        self.active.as_ref()
    }

    pub fn queue(&self) -> impl Iterator<Item = &Item> {
        self.queue.iter()
    }

    pub fn n_pending_steers(&self) -> usize {
        self.pending.len()
    }

    /// Steers of `session_key` waiting for the engine's answer.
    pub fn pending_steers_of(&self, session_key: &SessionKey) -> usize {
        self.pending.iter().filter(|p| p.item.session_key == *session_key).count()
    }

    /// Nothing active, queued or in flight: the conversation can be forgotten.
    /// Requests waiting behind the active run: queued, or steered and not
    /// yet answered.
    pub fn waiting(&self) -> usize {
        self.queue.len() + self.pending.len()
    }

    pub fn is_idle(&self) -> bool {
        self.active.is_none() && self.queue.is_empty() && self.pending.is_empty()
    }

    /// Whether the conversation holds this run in any form.
    pub fn holds(&self, run_id: &RunId) -> bool {
        self.active.as_ref().is_some_and(|a| &a.run_id == run_id)
            || self.queue.iter().any(|i| &i.run_id == run_id)
            || self.pending.iter().any(|p| &p.item.run_id == run_id)
    }

    /// The sessions of every request the conversation holds (active,
    /// queued or steered): in cluster mode, the sessions a node must keep.
    pub fn sessions(&self) -> impl Iterator<Item = &SessionKey> {
        let active = self.active.as_ref().map(|a| &a.session_key);
        active
            .into_iter()
            .chain(self.queue.iter().map(|i| &i.session_key))
            .chain(self.pending.iter().map(|p| &p.item.session_key))
    }

    /// A queued or in-flight item.
    pub fn find(&self, run_id: &RunId) -> Option<&Item> {
        self.queue.iter().chain(self.pending.iter().map(|p| &p.item)).find(|i| &i.run_id == run_id)
    }

    /// Marks `item` as the active run; the actor calls this once the gateway took it.
    pub fn set_active(&mut self, item: &Item) {
        self.active = Some(Active {
            run_id: item.run_id.clone(),
            session_key: item.session_key.clone(),
            engine: item.engine.clone(),
            cancelling: false,
            steered: Vec::new(),
            ended: None,
        });
    }

    /// Queues `item` ahead of everything else: the retry of the run that just
    /// failed goes next.
    pub fn queue_first(&mut self, item: Item) {
        self.queue.push_front(item);
    }

    /// The next item to dispatch, when nothing is active.
    pub fn next_item(&mut self) -> Option<Item> {
        if self.active.is_some() {
            return None;
        }
        self.queue.pop_front()
    }

    /// A new accepted request.
    pub fn submit(&mut self, mut item: Item, now: Instant, limits: Limits) -> Vec<Effect> {
        let live = self.active.as_ref().filter(|a| a.ended.is_none()).map(|a| a.run_id.clone());
        // An async auto-followup steers a live run, falling back to a followup.
        let mode = if item.mode == QueueMode::Followup && item.is_async_followup() && live.is_some()
        {
            QueueMode::Steer
        } else {
            item.mode
        };
        // Files cannot be steered into a live run: a message with files waits
        // for its own run.
        let live = live.filter(|_| !crate::media::has_attachments(&item.meta));
        if let (Some(kind), Some(host)) = (SteerKind::of(mode), live.clone()) {
            let effect = Effect::Steer {
                host,
                kind,
                run_id: item.run_id.clone(),
                text: item.prompt.clone(),
            };
            self.pending.push(PendingSteer { item, kind, cancelled: None });
            return vec![effect];
        }
        if let Some(kind) = SteerKind::of(mode) {
            item.mode = kind.fallback();
        }
        if self.active.is_none() && self.queue.is_empty() {
            if item.mode == QueueMode::Followup {
                self.last_followup_at = Some(now);
            }
            return vec![Effect::Dispatch(item)];
        }
        let mut effects = Vec::new();
        if item.mode == QueueMode::Interrupt {
            if let Some(active) = self.active.as_mut().filter(|a| !a.cancelling) {
                active.cancelling = true;
                effects.push(Effect::CancelActive {
                    run_id: active.run_id.clone(),
                    reason: RunError::Interrupted,
                });
            }
            effects.extend(item.phase(RunPhase::QueuedInSession));
            self.queue.push_front(item);
        } else {
            self.enqueue(item, now, &mut effects);
        }
        self.enforce_cap(limits, &mut effects);
        effects
    }

    /// Appends in collect or followup mode (the only modes that reach the queue's tail).
    fn enqueue(&mut self, item: Item, now: Instant, effects: &mut Vec<Effect>) {
        if item.mode == QueueMode::Followup {
            let recent = self
                .last_followup_at
                .is_some_and(|at| now.saturating_duration_since(at) <= FOLLOWUP_MERGE_WINDOW);
            self.last_followup_at = Some(now);
            let mergeable = self
                .queue
                .back()
                .is_some_and(|last| last.mode == QueueMode::Followup && !last.is_async_followup());
            if recent && mergeable && !item.is_async_followup() {
                let previous = self.queue.pop_back().expect("checked non-empty");
                let mut merged = item;
                merged.prompt = format!("{}\n{}", previous.prompt, merged.prompt);
                // The merged turn holds the earlier message too: it gets no
                // tool either message's filter kept from it.
                keep_tool_filter(&previous.meta, &mut merged.meta);
                let mut meta = previous.meta.clone();
                let files = crate::media::attachments_of(&merged.meta);
                merged.meta.remove(crate::media::META_KEY);
                meta.append(&mut merged.meta);
                // Files of both messages go to the merged run.
                crate::media::add_attachments(&mut meta, &files);
                merged.meta = meta;
                // As with `meta`, the newer request's settings win over the earlier's.
                merged.model = merged.model.take().or_else(|| previous.model.clone());
                merged.flags.goal_continuation |= previous.flags.goal_continuation;
                merged.seq = previous.seq;
                effects.extend(previous.phase(RunPhase::Aborted));
                let reason = RunError::Merged { into: merged.run_id.clone() };
                effects.push(Effect::Complete {
                    engine: previous.engine.to_string(),
                    completion: aborted(reason),
                    item: previous,
                });
                effects.push(Effect::Rejournal(merged.clone()));
                effects.extend(merged.phase(RunPhase::QueuedInSession));
                self.queue.push_back(merged);
                return;
            }
        }
        effects.extend(item.phase(RunPhase::QueuedInSession));
        let user_preempt = item.mode == QueueMode::Collect && item.origin.is_user();
        let at = if user_preempt {
            self.queue.iter().position(Item::is_goal_continuation).unwrap_or(self.queue.len())
        } else {
            self.queue.len()
        };
        self.queue.insert(at, item);
    }

    fn enforce_cap(&mut self, limits: Limits, effects: &mut Vec<Effect>) {
        // Without a drop policy a full conversation refuses new requests
        // instead; a steer that comes back to the queue may pass the cap.
        let (Some(cap), Some(drop)) = (limits.cap, limits.drop) else { return };
        while self.queue.len() > cap {
            let by_seq = self.queue.iter().enumerate().map(|(i, item)| (item.seq, i));
            let victim = match drop {
                DropPolicy::Oldest => by_seq.min(),
                DropPolicy::Newest => by_seq.max(),
            };
            let Some((_, at)) = victim else { return };
            let item = self.queue.remove(at).expect("index from the queue");
            effects.extend(item.phase(RunPhase::Aborted));
            effects.push(Effect::Complete {
                engine: item.engine.to_string(),
                completion: aborted(RunError::QueueOverflow),
                item,
            });
        }
    }

    /// The engine's answer to a steer.
    pub fn steer_result(
        &mut self,
        run_id: &RunId,
        accepted: bool,
        now: Instant,
        limits: Limits,
    ) -> Vec<Effect> {
        let Some(at) = self.pending.iter().position(|p| &p.item.run_id == run_id) else {
            return Vec::new();
        };
        let pending = self.pending.remove(at);
        let mut effects = Vec::new();
        match (accepted, pending.cancelled) {
            (true, _) => match self.active.as_mut() {
                Some(active) => match &active.ended {
                    Some((completion, engine)) => effects.push(Effect::Complete {
                        item: pending.item,
                        completion: completion.clone(),
                        engine: engine.clone(),
                    }),
                    None => active.steered.push(pending.item),
                },
                // Unreachable by construction: steers are only in flight with an active run.
                None => effects.push(Effect::Complete {
                    engine: pending.item.engine.to_string(),
                    completion: aborted(RunError::Interrupted),
                    item: pending.item,
                }),
            },
            (false, Some(reason)) => effects.push(Effect::Complete {
                engine: pending.item.engine.to_string(),
                completion: aborted(reason),
                item: pending.item,
            }),
            (false, None) => {
                let mut item = pending.item;
                item.mode = pending.kind.fallback();
                item.suppress_phases = true;
                self.enqueue(item, now, &mut effects);
                self.enforce_cap(limits, &mut effects);
            }
        }
        self.settle_ended(&mut effects);
        effects
    }

    /// The active run ended with `completion`. Steers it took complete with it;
    /// steers still in flight are answered first, then the next item is dispatched.
    pub fn run_ended(
        &mut self,
        run_id: &RunId,
        completion: &Completion,
        engine: &str,
    ) -> Vec<Effect> {
        let Some(active) = self.active.as_mut().filter(|a| &a.run_id == run_id) else {
            return Vec::new();
        };
        let mut effects: Vec<Effect> = active
            .steered
            .drain(..)
            .map(|item| Effect::Complete {
                item,
                completion: completion.clone(),
                engine: engine.to_owned(),
            })
            .collect();
        active.ended = Some((completion.clone(), engine.to_owned()));
        self.settle_ended(&mut effects);
        effects
    }

    /// Once the active run has ended and no steer is in flight, the next item goes.
    fn settle_ended(&mut self, effects: &mut Vec<Effect>) {
        let ended = self.active.as_ref().is_some_and(|a| a.ended.is_some());
        if !ended || !self.pending.is_empty() {
            return;
        }
        self.active = None;
        if let Some(item) = self.next_item() {
            effects.push(Effect::Dispatch(item));
        }
    }

    /// The dispatch of the item that was to become active failed: it completed
    /// already; move on to the next.
    pub fn dispatch_failed(&mut self) -> Vec<Effect> {
        self.next_item().map(Effect::Dispatch).into_iter().collect()
    }

    fn cancel_active_if(
        &mut self,
        reason: &RunError,
        matches: impl Fn(&Active) -> bool,
    ) -> Vec<Effect> {
        match self.active.as_mut() {
            Some(active) if active.ended.is_none() && matches(active) => {
                active.cancelling = true;
                vec![Effect::CancelActive { run_id: active.run_id.clone(), reason: reason.clone() }]
            }
            _ => Vec::new(),
        }
    }

    fn drop_queued_if(
        &mut self,
        reason: &RunError,
        matches: impl Fn(&Item) -> bool,
    ) -> Vec<Effect> {
        let mut effects = Vec::new();
        let mut kept = VecDeque::new();
        for item in self.queue.drain(..) {
            if matches(&item) {
                effects.extend(item.phase(RunPhase::Aborted));
                effects.push(Effect::Complete {
                    engine: item.engine.to_string(),
                    completion: aborted(reason.clone()),
                    item,
                });
            } else {
                kept.push_back(item);
            }
        }
        self.queue = kept;
        for pending in &mut self.pending {
            if matches(&pending.item) && pending.cancelled.is_none() {
                pending.cancelled = Some(reason.clone());
            }
        }
        effects
    }

    /// Cancels everything: the queue, in-flight steers and the active run.
    pub fn cancel_all(&mut self, reason: &RunError) -> Vec<Effect> {
        let mut effects = self.drop_queued_if(reason, |_| true);
        effects.extend(self.cancel_active_if(reason, |_| true));
        effects
    }

    /// Cancels the active run if it belongs to `session_key`; the queue stays.
    pub fn cancel_session(&mut self, session_key: &SessionKey, reason: &RunError) -> Vec<Effect> {
        self.cancel_active_if(reason, |a| a.session_key == *session_key)
    }

    /// Drops the session's queued work and in-flight steers and cancels its active run.
    pub fn abort_session(&mut self, session_key: &SessionKey, reason: &RunError) -> Vec<Effect> {
        let mut effects = self.drop_queued_if(reason, |i| i.session_key == *session_key);
        effects.extend(self.cancel_active_if(reason, |a| a.session_key == *session_key));
        effects
    }

    /// Drops or cancels one run, wherever it is.
    pub fn abort_run(&mut self, run_id: &RunId, reason: &RunError) -> Vec<Effect> {
        let mut effects = self.drop_queued_if(reason, |i| &i.run_id == run_id);
        effects.extend(self.cancel_active_if(reason, |a| &a.run_id == run_id));
        effects
    }
}

#[cfg(test)]
mod tests;
