//! The queue state machine: each mode's transitions, steer answers, run ends,
//! caps and the cancel and abort variants.

use std::collections::BTreeMap;

use super::*;

fn item(n: u64, mode: QueueMode) -> Item {
    Item {
        run_id: RunId::parse(&format!("r{n}")).unwrap(),
        session_key: "s".into(),
        conversation: ConversationKey::session("s"),
        prompt: format!("p{n}"),
        engine: "fake".parse().unwrap(),
        resume: None,
        cwd: None,
        model: None,
        flags: RequestFlags::default(),
        meta: BTreeMap::new(),
        origin: Origin::Cron,
        mode,
        seq: n,
        suppress_phases: false,
        route: RouteChoice {
            auto_resume: false,
            chosen_engine: None,
            fallback_engine: "fake".parse().unwrap(),
        },
        budget: None,
    }
}

fn id(n: u64) -> RunId {
    RunId::parse(&format!("r{n}")).unwrap()
}

/// A conversation whose run `r0` is active.
fn busy() -> Conversation {
    let mut conv = Conversation::default();
    conv.set_active(&item(0, QueueMode::Collect));
    conv
}

fn queued(conv: &Conversation) -> Vec<String> {
    conv.queue().map(|i| i.prompt.clone()).collect()
}

/// Effects without phases, for the tests that are about what happens.
fn acts(effects: Vec<Effect>) -> Vec<Effect> {
    effects.into_iter().filter(|e| !matches!(e, Effect::Phase { .. })).collect()
}

fn completed_ids(effects: &[Effect]) -> Vec<(String, Option<String>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Complete { item, completion, .. } => Some((
                item.run_id.to_string(),
                completion.error.as_ref().map(|e| e.code().to_owned()),
            )),
            _ => None,
        })
        .collect()
}

fn t0() -> Instant {
    Instant::now()
}

#[test]
fn an_idle_conversation_dispatches_at_once_in_every_mode() {
    for mode in QueueMode::ALL {
        let mut conv = Conversation::default();
        let effects = conv.submit(item(1, mode), t0(), Limits::default());
        assert!(
            matches!(&effects[..], [Effect::Dispatch(i)] if i.run_id == id(1)),
            "{mode:?}: {effects:?}"
        );
    }
}

#[test]
fn collect_appends_and_reports_queued_in_session() {
    let mut conv = busy();
    let effects = conv.submit(item(1, QueueMode::Collect), t0(), Limits::default());
    assert_eq!(
        effects,
        vec![Effect::Phase {
            run_id: id(1),
            session_key: "s".into(),
            phase: RunPhase::QueuedInSession
        }]
    );
    conv.submit(item(2, QueueMode::Collect), t0(), Limits::default());
    assert_eq!(queued(&conv), ["p1", "p2"]);
}

#[test]
fn user_collect_goes_before_queued_goal_continuations() {
    for origin in Origin::ALL {
        let mut conv = busy();
        let now = t0();
        let mut goal = item(1, QueueMode::Followup);
        goal.flags.goal_continuation = true;
        conv.submit(goal, now, Limits::default());
        conv.submit(item(2, QueueMode::Collect), now, Limits::default());
        let mut sent = item(3, QueueMode::Collect);
        sent.origin = origin;
        conv.submit(sent, now, Limits::default());
        let expected = match origin {
            Origin::Channel | Origin::ControlPlane | Origin::Webhook => ["p3", "p1", "p2"],
            Origin::Cron | Origin::Internal => ["p1", "p2", "p3"],
        };
        assert_eq!(queued(&conv), expected, "{origin:?}");
    }
}

#[test]
fn followups_within_the_window_merge_keeping_the_newer_identity() {
    let mut conv = busy();
    let now = t0();
    conv.submit(item(1, QueueMode::Followup), now, Limits::default());
    let effects = conv.submit(
        item(2, QueueMode::Followup),
        now + Duration::from_millis(500),
        Limits::default(),
    );
    assert_eq!(completed_ids(&effects), [("r1".to_owned(), Some("merged".to_owned()))]);
    assert!(effects.iter().any(
        |e| matches!(e, Effect::Phase { run_id, phase: RunPhase::Aborted, .. } if *run_id == id(1))
    ));
    let merged: Vec<&Item> = conv.queue().collect();
    assert_eq!(merged.len(), 1);
    assert_eq!(merged[0].run_id, id(2));
    assert_eq!(merged[0].prompt, "p1\np2");
    assert_eq!(merged[0].seq, 1, "the merged turn keeps the earlier place");
    assert!(effects.iter().any(|e| matches!(e, Effect::Rejournal(i) if i.prompt == "p1\np2")));
}

#[test]
fn followups_outside_the_window_do_not_merge() {
    let mut conv = busy();
    let now = t0();
    conv.submit(item(1, QueueMode::Followup), now, Limits::default());
    conv.submit(item(2, QueueMode::Followup), now + Duration::from_millis(501), Limits::default());
    assert_eq!(queued(&conv), ["p1", "p2"]);
}

#[test]
fn async_followups_never_merge() {
    let mut conv = busy();
    let now = t0();
    let mut first = item(1, QueueMode::Followup);
    first.flags.auto_followup = true;
    // With a live run an async followup steers instead of queueing.
    let effects = conv.submit(first, now, Limits::default());
    assert!(matches!(&effects[..], [Effect::Steer { kind: SteerKind::Steer, .. }]));
    conv.submit(item(2, QueueMode::Followup), now, Limits::default());
    let effects = conv.steer_result(&id(1), false, now, Limits::default());
    assert!(completed_ids(&effects).is_empty());
    assert_eq!(queued(&conv), ["p2", "p1"], "a rejected async steer is queued, not merged");
}

#[test]
fn steer_goes_into_the_live_run() {
    let mut conv = busy();
    let effects = conv.submit(item(1, QueueMode::Steer), t0(), Limits::default());
    assert_eq!(
        effects,
        vec![Effect::Steer {
            host: id(0),
            kind: SteerKind::Steer,
            run_id: id(1),
            text: "p1".into()
        }]
    );
    assert_eq!(conv.n_pending_steers(), 1);
    assert!(conv.steer_result(&id(1), true, t0(), Limits::default()).is_empty());
    assert_eq!(conv.n_pending_steers(), 0);
    // The steered request completes with the run that took it.
    let done = Completion::success("answer", None);
    let effects = conv.run_ended(&id(0), &done, "fake");
    assert_eq!(completed_ids(&effects), [("r1".to_owned(), None)]);
    assert!(conv.is_idle());
}

#[test]
fn rejected_steers_fall_back_by_mode() {
    for (mode, expect) in [
        (QueueMode::Steer, QueueMode::Followup),
        (QueueMode::SteerBacklog, QueueMode::Collect),
        (QueueMode::Redirect, QueueMode::Followup),
    ] {
        let mut conv = busy();
        conv.submit(item(1, mode), t0(), Limits::default());
        let effects = conv.steer_result(&id(1), false, t0(), Limits::default());
        assert!(effects.is_empty(), "fallback emits no phases: {effects:?}");
        let queue: Vec<&Item> = conv.queue().collect();
        assert_eq!(queue.len(), 1);
        assert_eq!(queue[0].mode, expect, "{mode:?}");
        assert!(queue[0].suppress_phases);
    }
}

#[test]
fn steer_without_an_active_run_behaves_as_its_fallback() {
    let mut conv = busy();
    let done = Completion::success("", None);
    conv.submit(item(1, QueueMode::Collect), t0(), Limits::default());
    // r0 ends and r1 dispatches; nothing is live until the actor sets it active.
    let effects = conv.run_ended(&id(0), &done, "fake");
    assert!(matches!(&acts(effects)[..], [Effect::Dispatch(i)] if i.run_id == id(1)));
    let effects = conv.submit(item(2, QueueMode::SteerBacklog), t0(), Limits::default());
    assert!(matches!(&acts(effects)[..], [Effect::Dispatch(i)] if i.mode == QueueMode::Collect));
}

#[test]
fn steers_in_flight_when_the_run_ends_are_answered_before_the_next_item() {
    let mut conv = busy();
    let now = t0();
    conv.submit(item(1, QueueMode::Collect), now, Limits::default());
    conv.submit(item(2, QueueMode::Steer), now, Limits::default());
    let done = Completion::success("", None);
    let effects = conv.run_ended(&id(0), &done, "fake");
    assert!(acts(effects).is_empty(), "waits for the steer's answer");
    // The engine refused (the run was over): the steer is queued as a followup.
    let effects = acts(conv.steer_result(&id(2), false, now, Limits::default()));
    assert!(matches!(&effects[..], [Effect::Dispatch(i)] if i.run_id == id(1)), "{effects:?}");
    assert_eq!(queued(&conv), ["p2"]);
}

#[test]
fn a_steer_accepted_after_the_run_ended_completes_with_that_run() {
    let mut conv = busy();
    conv.submit(item(1, QueueMode::Steer), t0(), Limits::default());
    let done = Completion::success("the answer", None);
    conv.run_ended(&id(0), &done, "fake");
    let effects = conv.steer_result(&id(1), true, t0(), Limits::default());
    assert_eq!(completed_ids(&effects), [("r1".to_owned(), None)]);
    assert!(conv.is_idle());
}

#[test]
fn interrupt_cancels_the_active_run_and_goes_first() {
    let mut conv = busy();
    conv.submit(item(1, QueueMode::Collect), t0(), Limits::default());
    let effects = acts(conv.submit(item(2, QueueMode::Interrupt), t0(), Limits::default()));
    assert_eq!(
        effects,
        vec![Effect::CancelActive { run_id: id(0), reason: RunError::Interrupted }]
    );
    assert_eq!(queued(&conv), ["p2", "p1"]);
    // A second interrupt does not cancel again but still goes first.
    let effects = acts(conv.submit(item(3, QueueMode::Interrupt), t0(), Limits::default()));
    assert!(effects.is_empty());
    assert_eq!(queued(&conv), ["p3", "p2", "p1"]);
}

#[test]
fn the_cap_drops_the_oldest_or_the_newest() {
    for (drop, dropped, kept) in
        [(DropPolicy::Oldest, "r1", ["p2", "p3"]), (DropPolicy::Newest, "r3", ["p1", "p2"])]
    {
        let limits = Limits { cap: Some(2), drop: Some(drop) };
        let mut conv = busy();
        conv.submit(item(1, QueueMode::Collect), t0(), limits);
        conv.submit(item(2, QueueMode::Collect), t0(), limits);
        let effects = conv.submit(item(3, QueueMode::Collect), t0(), limits);
        assert_eq!(
            completed_ids(&effects),
            [(dropped.to_owned(), Some("queue_overflow".to_owned()))]
        );
        assert_eq!(queued(&conv), kept);
    }
}

#[test]
fn without_a_drop_policy_a_full_conversation_refuses_and_drops_nothing() {
    let limits = Limits { cap: Some(2), drop: None };
    let mut conv = busy();
    assert!(!limits.refuses(&conv));
    conv.submit(item(1, QueueMode::Collect), t0(), limits);
    assert!(!limits.refuses(&conv));
    // A steer in flight waits too.
    conv.submit(item(2, QueueMode::Steer), t0(), limits);
    assert_eq!(conv.waiting(), 2);
    assert!(limits.refuses(&conv));
    // A refused steer comes back to the queue past the cap: accepted, never dropped.
    conv.submit(item(3, QueueMode::Collect), t0(), limits);
    let effects = acts(conv.steer_result(&id(2), false, t0(), limits));
    assert!(completed_ids(&effects).is_empty(), "{effects:?}");
    assert_eq!(queued(&conv).len(), 3);
    assert!(!Limits { cap: None, drop: None }.refuses(&conv));
    assert!(!Limits { cap: Some(2), drop: Some(DropPolicy::Oldest) }.refuses(&conv));
}

#[test]
fn cancel_all_clears_queue_and_steers_and_cancels_the_run() {
    let mut conv = busy();
    conv.submit(item(1, QueueMode::Collect), t0(), Limits::default());
    conv.submit(item(2, QueueMode::Steer), t0(), Limits::default());
    let effects = acts(conv.cancel_all(&RunError::UserRequested));
    assert_eq!(completed_ids(&effects), [("r1".to_owned(), Some("user_requested".to_owned()))]);
    assert!(
        effects.contains(&Effect::CancelActive { run_id: id(0), reason: RunError::UserRequested })
    );
    // The steer in flight is not re-queued when refused; it completes as cancelled.
    let effects = conv.steer_result(&id(2), false, t0(), Limits::default());
    assert_eq!(completed_ids(&effects), [("r2".to_owned(), Some("user_requested".to_owned()))]);
    assert!(conv.queue().next().is_none());
}

#[test]
fn cancel_session_keeps_the_queue() {
    let mut conv = busy();
    conv.submit(item(1, QueueMode::Collect), t0(), Limits::default());
    let effects = conv.cancel_session(&SessionKey::from("s"), &RunError::UserRequested);
    assert_eq!(
        effects,
        vec![Effect::CancelActive { run_id: id(0), reason: RunError::UserRequested }]
    );
    assert_eq!(queued(&conv), ["p1"]);
    assert!(conv.cancel_session(&SessionKey::from("other"), &RunError::UserRequested).is_empty());
}

#[test]
fn abort_session_drops_only_that_sessions_work() {
    let mut conv = busy();
    conv.submit(item(1, QueueMode::Collect), t0(), Limits::default());
    let mut other = item(2, QueueMode::Collect);
    other.session_key = "t".into();
    conv.submit(other, t0(), Limits::default());
    let effects = acts(conv.abort_session(&SessionKey::from("s"), &RunError::UserRequested));
    assert_eq!(completed_ids(&effects), [("r1".to_owned(), Some("user_requested".to_owned()))]);
    assert!(effects.iter().any(|e| matches!(e, Effect::CancelActive { .. })));
    assert_eq!(queued(&conv), ["p2"]);
}

#[test]
fn abort_run_finds_queued_and_active_runs() {
    let mut conv = busy();
    conv.submit(item(1, QueueMode::Collect), t0(), Limits::default());
    let effects = acts(conv.abort_run(&id(1), &RunError::UserRequested));
    assert_eq!(completed_ids(&effects), [("r1".to_owned(), Some("user_requested".to_owned()))]);
    let effects = conv.abort_run(&id(0), &RunError::UserRequested);
    assert_eq!(
        effects,
        vec![Effect::CancelActive { run_id: id(0), reason: RunError::UserRequested }]
    );
    assert!(conv.abort_run(&id(9), &RunError::UserRequested).is_empty());
}

fn with_file(mut item: Item, name: &str) -> Item {
    let file = crate::media::Attachment {
        kind: crate::media::AttachmentKind::File,
        path: format!("/stage/{name}").into(),
        name: name.into(),
        mime: "text/plain".into(),
        bytes: 1,
        uploads_dir: None,
    };
    crate::media::add_attachments(&mut item.meta, &[file]);
    item
}

#[test]
fn a_message_with_files_waits_for_its_own_run_instead_of_steering() {
    let mut conv = busy();
    let effects =
        conv.submit(with_file(item(1, QueueMode::Steer), "a.txt"), t0(), Limits::default());
    assert!(acts(effects).is_empty(), "queued, not steered");
    assert_eq!(queued(&conv), ["p1"]);
}

#[test]
fn merged_followups_keep_the_files_of_both_messages() {
    let mut conv = busy();
    let now = t0();
    conv.submit(with_file(item(1, QueueMode::Followup), "a.txt"), now, Limits::default());
    conv.submit(with_file(item(2, QueueMode::Followup), "b.txt"), now, Limits::default());
    let merged: Vec<&Item> = conv.queue().collect();
    let names: Vec<String> =
        crate::media::attachments_of(&merged[0].meta).into_iter().map(|a| a.name).collect();
    assert_eq!(names, ["a.txt", "b.txt"]);
}

fn with_tools(mut item: Item, patterns: &[&str]) -> Item {
    let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
    crate::mcp::ToolFilter::narrow_meta(&mut item.meta, &patterns);
    item
}

#[test]
fn merged_followups_keep_the_tool_filters_of_both_messages() {
    use crate::mcp::ToolFilter;
    let check = |earlier: Item, later: Item, allowed: &[&str], refused: &[&str]| {
        let mut conv = busy();
        conv.submit(earlier, t0(), Limits::default());
        conv.submit(later, t0(), Limits::default());
        let merged: Vec<&Item> = conv.queue().collect();
        assert_eq!(merged.len(), 1, "merged");
        let filter = ToolFilter::from_meta(&merged[0].meta);
        for tool in allowed {
            assert!(filter.allows(tool), "{tool} allowed by {filter:?}");
        }
        for tool in refused {
            assert!(!filter.allows(tool), "{tool} refused by {filter:?}");
        }
        filter.lists().len()
    };
    let narrow = |n| with_tools(item(n, QueueMode::Followup), &["bash", "github__*"]);
    let lists = check(narrow(1), item(2, QueueMode::Followup), &["bash"], &["read"]);
    assert_eq!(lists, 1, "the earlier message's filter holds for the merged turn");
    let lists = check(item(1, QueueMode::Followup), narrow(2), &["github__x"], &["read"]);
    assert_eq!(lists, 1);
    let lists = check(narrow(1), narrow(2), &["bash"], &["read"]);
    assert_eq!(lists, 1, "the same list is not repeated");
    let only_bash = with_tools(item(2, QueueMode::Followup), &["bash"]);
    check(narrow(1), only_bash, &["bash"], &["github__x"]);
}
