//! A checker over what a cluster test recorded from the outside: the runs the
//! nodes accepted, the engine intervals the fake CLI logged, the completions
//! the database holds, the Bot API's pollers and what followers of runs on
//! other nodes saw.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds ([`monotonic_ns`]), one clock for
//! the test, the fake CLIs and their witnesses.
//!
//! [`History::check`] lists every rule the history breaks:
//! - at no moment do more engines run than the cap allows;
//! - no two runs of one conversation overlap, and they start in admission
//!   order (a run merged into a later one never starts: the later one's prompt
//!   holds it);
//! - every accepted run has exactly one completion, and started its engine at
//!   most once; no engine ran for a run nobody accepted;
//! - at most one node polled the Bot API at any moment (a poll of a node that
//!   was killed or stopped ends, for this rule, when the node went down);
//! - a follower of a run saw every stored event of the run exactly once, in
//!   order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// `CLOCK_MONOTONIC` now, in nanoseconds: comparable across the processes of
/// one machine, unlike [`std::time::Instant`].
pub fn monotonic_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there");
    let ns = i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec());
    u64::try_from(ns).unwrap_or(0)
}

/// A run a node accepted (202), or a chat message that became a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub run_id: String,
    pub conversation: String,
    /// Admission order within the conversation: the order in which the test
    /// had each acknowledged before sending the next.
    pub order: u64,
}

/// One engine process, from the fake CLI's run log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpan {
    /// The run it ran: the last run id its prompt names (a merged prompt
    /// holds the earlier messages first).
    pub run_id: String,
    /// Every run id the prompt names, the merged ones first.
    pub prompt_runs: Vec<String>,
    pub start_ns: u64,
    /// When the process ended; `None` when no end was ever seen.
    pub end_ns: Option<u64>,
}

/// How one accepted run ended, as the store says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub run_id: String,
    /// `run_completed` events stored for the run.
    pub count: usize,
    /// The run the router merged this one into, when it did.
    pub merged_into: Option<String>,
}

/// One `getUpdates` call of a node, from its start to its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Poll {
    pub node: String,
    pub start_ns: u64,
    /// `None` while it was still open at the end of the history.
    pub end_ns: Option<u64>,
}

/// A time a node was down: killed (`to_ns` is its restart, or `None`) or
/// stopped (`to_ns` is its `SIGCONT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Down {
    pub node: String,
    pub from_ns: u64,
    pub to_ns: Option<u64>,
}

/// What a follower of a run on some node saw, against what the store holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Follow {
    pub run_id: String,
    /// Event indexes as the stream delivered them, across reconnects.
    pub seen: Vec<u64>,
    /// The run's stored event indexes, in order.
    pub stored: Vec<u64>,
}

/// Everything recorded.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub cap: usize,
    pub accepted: Vec<Accepted>,
    pub engines: Vec<EngineSpan>,
    pub completions: Vec<Completion>,
    pub polls: Vec<Poll>,
    pub down: Vec<Down>,
    pub follows: Vec<Follow>,
}

/// A rule the history breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// `running` engines at once at `at_ns`, above the cap.
    OverCap { running: usize, cap: usize, at_ns: u64, runs: Vec<String> },
    /// Two runs of `conversation` ran at once.
    Overlap { conversation: String, first: String, second: String },
    /// `later` (admitted after `earlier`) started its engine first.
    OutOfOrder { conversation: String, earlier: String, later: String },
    /// The run's engine started `starts` times.
    Restarted { run_id: String, starts: usize },
    /// An engine ran for a run no node accepted.
    Unaccepted { run_id: String },
    /// The engine process never ended.
    NeverEnded { run_id: String },
    /// The run has `count` completions (0: it never completed).
    Completions { run_id: String, count: usize },
    /// The run was merged into `into`, whose engine never saw it.
    LostInMerge { run_id: String, into: String },
    /// Two nodes polled the Bot API at once.
    TwoPollers { first: String, second: String, at_ns: u64 },
    /// A follower's stream differs from the stored events.
    Followed { run_id: String, seen: Vec<u64>, stored: Vec<u64> },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::OverCap { running, cap, at_ns, runs } => {
                write!(f, "{running} engines ran at once (cap {cap}) at {at_ns} ns: {runs:?}")
            }
            Violation::Overlap { conversation, first, second } => {
                write!(f, "{first} and {second} of {conversation} ran at once")
            }
            Violation::OutOfOrder { conversation, earlier, later } => {
                write!(f, "{later} of {conversation} started before {earlier}, admitted earlier")
            }
            Violation::Restarted { run_id, starts } => {
                write!(f, "the engine of {run_id} started {starts} times")
            }
            Violation::Unaccepted { run_id } => {
                write!(f, "an engine ran for {run_id}, never accepted")
            }
            Violation::NeverEnded { run_id } => write!(f, "the engine of {run_id} never ended"),
            Violation::Completions { run_id, count } => {
                write!(f, "{run_id} has {count} completions, not 1")
            }
            Violation::LostInMerge { run_id, into } => {
                write!(f, "{run_id} was merged into {into}, whose prompt lacks it")
            }
            Violation::TwoPollers { first, second, at_ns } => {
                write!(f, "{first} and {second} polled the Bot API at once at {at_ns} ns")
            }
            Violation::Followed { run_id, seen, stored } => {
                write!(f, "a follower of {run_id} saw {seen:?}, the store holds {stored:?}")
            }
        }
    }
}

impl History {
    /// Every rule the history breaks; empty when it keeps them all.
    pub fn check(&self) -> Vec<Violation> {
        let mut found = Vec::new();
        self.check_cap(&mut found);
        self.check_conversations(&mut found);
        self.check_runs(&mut found);
        self.check_polls(&mut found);
        self.check_follows(&mut found);
        found
    }

    /// The most engines that ran at once: a test whose load never reached the
    /// cap says nothing about it.
    pub fn peak_engines(&self) -> usize {
        let mut edges: Vec<(u64, i8)> = Vec::new();
        for span in &self.engines {
            edges.push((span.start_ns, 1));
            edges.push((span.end_ns.unwrap_or(u64::MAX), -1));
        }
        edges.sort_unstable();
        let (mut running, mut peak) = (0i64, 0i64);
        for (_, edge) in edges {
            running += i64::from(edge);
            peak = peak.max(running);
        }
        usize::try_from(peak).unwrap_or(0)
    }

    fn check_cap(&self, found: &mut Vec<Violation>) {
        // (time, 0 = end before 1 = start at the same time, index).
        let mut edges = Vec::new();
        for (n, span) in self.engines.iter().enumerate() {
            edges.push((span.start_ns, 1, n));
            edges.push((span.end_ns.unwrap_or(u64::MAX), 0, n));
        }
        edges.sort_unstable();
        let mut running = HashSet::new();
        for (at_ns, edge, n) in edges {
            if edge == 0 {
                running.remove(&n);
                continue;
            }
            running.insert(n);
            // One report per excursion above the cap, when it crosses it.
            if running.len() == self.cap + 1 {
                let mut runs: Vec<String> =
                    running.iter().map(|n| self.engines[*n].run_id.clone()).collect();
                runs.sort();
                found.push(Violation::OverCap {
                    running: running.len(),
                    cap: self.cap,
                    at_ns,
                    runs,
                });
            }
        }
    }

    fn check_conversations(&self, found: &mut Vec<Violation>) {
        let accepted: HashMap<&str, &Accepted> =
            self.accepted.iter().map(|a| (a.run_id.as_str(), a)).collect();
        let mut by_conversation: BTreeMap<&str, Vec<(&EngineSpan, u64)>> = BTreeMap::new();
        for span in &self.engines {
            if let Some(run) = accepted.get(span.run_id.as_str()) {
                by_conversation.entry(&run.conversation).or_default().push((span, run.order));
            }
        }
        for (conversation, mut spans) in by_conversation {
            spans.sort_by_key(|(span, order)| (span.start_ns, *order));
            for pair in spans.windows(2) {
                let ((first, first_order), (second, second_order)) = (pair[0], pair[1]);
                if first.end_ns.is_none_or(|end| end > second.start_ns) {
                    found.push(Violation::Overlap {
                        conversation: conversation.to_owned(),
                        first: first.run_id.clone(),
                        second: second.run_id.clone(),
                    });
                }
                if second_order < first_order {
                    found.push(Violation::OutOfOrder {
                        conversation: conversation.to_owned(),
                        earlier: second.run_id.clone(),
                        later: first.run_id.clone(),
                    });
                }
            }
        }
    }

    fn check_runs(&self, found: &mut Vec<Violation>) {
        let accepted: HashSet<&str> = self.accepted.iter().map(|a| a.run_id.as_str()).collect();
        let mut starts: BTreeMap<&str, usize> = BTreeMap::new();
        for span in &self.engines {
            *starts.entry(&span.run_id).or_default() += 1;
            if span.end_ns.is_none() {
                found.push(Violation::NeverEnded { run_id: span.run_id.clone() });
            }
        }
        for (run_id, starts) in &starts {
            if !accepted.contains(run_id) {
                found.push(Violation::Unaccepted { run_id: (*run_id).to_owned() });
            }
            if *starts > 1 {
                found.push(Violation::Restarted { run_id: (*run_id).to_owned(), starts: *starts });
            }
        }
        let completions: HashMap<&str, &Completion> =
            self.completions.iter().map(|c| (c.run_id.as_str(), c)).collect();
        for run in &self.accepted {
            let Some(completion) = completions.get(run.run_id.as_str()) else {
                found.push(Violation::Completions { run_id: run.run_id.clone(), count: 0 });
                continue;
            };
            if completion.count != 1 {
                found.push(Violation::Completions {
                    run_id: run.run_id.clone(),
                    count: completion.count,
                });
            }
            if let Some(into) = &completion.merged_into {
                let held = self
                    .engines
                    .iter()
                    .filter(|span| &span.run_id == into)
                    .all(|span| span.prompt_runs.contains(&run.run_id));
                if !held {
                    found.push(Violation::LostInMerge {
                        run_id: run.run_id.clone(),
                        into: into.clone(),
                    });
                }
            }
        }
    }

    /// The end of `poll` for the one-poller rule: its answer, or the moment
    /// its node went down while it was open, whichever came first.
    fn poll_end(&self, poll: &Poll) -> u64 {
        let down = self
            .down
            .iter()
            .filter(|d| d.node == poll.node && d.from_ns >= poll.start_ns)
            .map(|d| d.from_ns)
            .min();
        match (poll.end_ns, down) {
            (Some(end), Some(down)) => end.min(down),
            (Some(end), None) => end,
            (None, Some(down)) => down,
            (None, None) => u64::MAX,
        }
    }

    fn check_polls(&self, found: &mut Vec<Violation>) {
        let mut polls: Vec<(u64, u64, &str)> =
            self.polls.iter().map(|p| (p.start_ns, self.poll_end(p), p.node.as_str())).collect();
        polls.sort_unstable();
        // The open poll that ends last, and its node.
        let mut open: Option<(u64, &str)> = None;
        for (start, end, node) in polls {
            if let Some((open_end, open_node)) = open {
                if open_node != node && open_end > start {
                    found.push(Violation::TwoPollers {
                        first: open_node.to_owned(),
                        second: node.to_owned(),
                        at_ns: start,
                    });
                }
            }
            if open.is_none_or(|(open_end, _)| end > open_end) {
                open = Some((end, node));
            }
        }
    }

    fn check_follows(&self, found: &mut Vec<Violation>) {
        for follow in &self.follows {
            if follow.seen != follow.stored {
                found.push(Violation::Followed {
                    run_id: follow.run_id.clone(),
                    seen: follow.seen.clone(),
                    stored: follow.stored.clone(),
                });
            }
        }
    }
}

/// One line of the fake CLI's run log (`FAKE_CLI_RUN_LOG`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunLogLine {
    /// `start <ns> <pid> <run id>…`: the engine started with a prompt naming these runs.
    Start { ns: u64, pid: u32, runs: Vec<String> },
    /// `end <ns> <pid> exited|killed`: the process ended.
    End { ns: u64, pid: u32 },
}

impl RunLogLine {
    pub fn parse(line: &str) -> Option<RunLogLine> {
        let mut words = line.split_whitespace();
        let kind = words.next()?;
        let ns = words.next()?.parse().ok()?;
        let pid = words.next()?.parse().ok()?;
        match kind {
            "start" => {
                Some(RunLogLine::Start { ns, pid, runs: words.map(str::to_owned).collect() })
            }
            "end" => Some(RunLogLine::End { ns, pid }),
            _ => None,
        }
    }
}

/// The engine spans of a run log's text: each start with the end of the same
/// process. A start whose prompt names no run is left out (not a test run).
pub fn engine_spans(log: &str) -> Vec<EngineSpan> {
    let mut spans: Vec<EngineSpan> = Vec::new();
    let mut open: HashMap<u32, usize> = HashMap::new();
    for line in log.lines().filter_map(RunLogLine::parse) {
        match line {
            RunLogLine::Start { ns, pid, runs } => {
                let Some(run_id) = runs.last().cloned() else { continue };
                open.insert(pid, spans.len());
                spans.push(EngineSpan { run_id, prompt_runs: runs, start_ns: ns, end_ns: None });
            }
            RunLogLine::End { ns, pid } => {
                if let Some(n) = open.remove(&pid) {
                    spans[n].end_ns = Some(ns);
                }
            }
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted(run_id: &str, conversation: &str, order: u64) -> Accepted {
        Accepted { run_id: run_id.into(), conversation: conversation.into(), order }
    }

    fn span(run_id: &str, start_ns: u64, end_ns: u64) -> EngineSpan {
        EngineSpan {
            run_id: run_id.into(),
            prompt_runs: vec![run_id.into()],
            start_ns,
            end_ns: Some(end_ns),
        }
    }

    fn done(run_id: &str) -> Completion {
        Completion { run_id: run_id.into(), count: 1, merged_into: None }
    }

    /// Two conversations of two runs each, cap 2, everything in order.
    fn good() -> History {
        History {
            cap: 2,
            accepted: vec![
                accepted("a1", "a", 0),
                accepted("a2", "a", 1),
                accepted("b1", "b", 0),
                accepted("b2", "b", 1),
            ],
            engines: vec![
                span("a1", 0, 10),
                span("a2", 10, 20),
                span("b1", 5, 15),
                span("b2", 15, 30),
            ],
            completions: vec![done("a1"), done("a2"), done("b1"), done("b2")],
            polls: vec![
                Poll { node: "n1".into(), start_ns: 0, end_ns: Some(10) },
                Poll { node: "n2".into(), start_ns: 10, end_ns: Some(20) },
            ],
            down: Vec::new(),
            follows: vec![Follow {
                run_id: "a1".into(),
                seen: vec![1, 2, 3],
                stored: vec![1, 2, 3],
            }],
        }
    }

    #[test]
    fn a_good_history_passes() {
        assert_eq!(good().check(), Vec::new());
        assert_eq!(good().peak_engines(), 2);
    }

    #[test]
    fn engines_beyond_the_cap_are_caught() {
        let mut history = good();
        history.accepted.push(accepted("c1", "c", 0));
        history.completions.push(done("c1"));
        history.engines.push(span("c1", 6, 8));
        let found = history.check();
        assert!(
            matches!(found.as_slice(), [Violation::OverCap { running: 3, cap: 2, at_ns: 6, .. }]),
            "{found:?}"
        );
        // Each excursion above the cap is reported once.
        history.accepted.push(accepted("d1", "d", 0));
        history.completions.push(done("d1"));
        history.engines.push(span("d1", 7, 9));
        history.accepted.push(accepted("e1", "e", 0));
        history.completions.push(done("e1"));
        history.engines.push(span("e1", 25, 28));
        history.accepted.push(accepted("f1", "f", 0));
        history.completions.push(done("f1"));
        history.engines.push(span("f1", 26, 27));
        let found = history.check();
        assert!(
            matches!(
                found.as_slice(),
                [
                    Violation::OverCap { at_ns: 6, .. },
                    Violation::OverCap { running: 3, at_ns: 26, .. }
                ]
            ),
            "{found:?}"
        );
        // Ending exactly when the next starts is no overlap.
        let mut history = good();
        history.accepted.push(accepted("c1", "c", 0));
        history.completions.push(done("c1"));
        history.engines.push(span("c1", 20, 25));
        assert_eq!(history.check(), Vec::new());
    }

    #[test]
    fn overlapping_runs_of_one_conversation_are_caught() {
        let mut history = good();
        // Room under the cap: only the conversation's rule is broken.
        history.cap = 3;
        history.engines[1] = span("a2", 9, 20);
        let found = history.check();
        assert_eq!(
            found,
            vec![Violation::Overlap {
                conversation: "a".into(),
                first: "a1".into(),
                second: "a2".into()
            }]
        );
    }

    #[test]
    fn a_later_run_starting_first_is_caught() {
        let mut history = good();
        history.engines[0] = span("a1", 10, 20);
        history.engines[1] = span("a2", 0, 10);
        let found = history.check();
        assert_eq!(
            found,
            vec![Violation::OutOfOrder {
                conversation: "a".into(),
                earlier: "a1".into(),
                later: "a2".into()
            }]
        );
    }

    #[test]
    fn two_completions_and_a_missing_one_are_caught() {
        let mut history = good();
        history.completions[0].count = 2;
        history.completions.remove(3);
        let found = history.check();
        assert_eq!(
            found,
            vec![
                Violation::Completions { run_id: "a1".into(), count: 2 },
                Violation::Completions { run_id: "b2".into(), count: 0 },
            ]
        );
    }

    #[test]
    fn a_second_start_and_an_unaccepted_run_are_caught() {
        let mut history = good();
        history.engines.push(span("a2", 40, 50));
        history.engines.push(span("ghost", 60, 70));
        let found = history.check();
        assert_eq!(
            found,
            vec![
                Violation::Restarted { run_id: "a2".into(), starts: 2 },
                Violation::Unaccepted { run_id: "ghost".into() },
            ]
        );
    }

    #[test]
    fn an_engine_that_never_ends_is_caught_and_holds_its_place_under_the_cap() {
        let mut history = good();
        history.engines[3].end_ns = None;
        history.accepted.push(accepted("c1", "c", 0));
        history.completions.push(done("c1"));
        history.engines.push(span("c1", 100, 110));
        history.engines.push(span("a3", 100, 110));
        history.accepted.push(accepted("a3", "a", 2));
        history.completions.push(done("a3"));
        let found = history.check();
        assert!(found.contains(&Violation::NeverEnded { run_id: "b2".into() }), "{found:?}");
        assert!(
            found.iter().any(|v| matches!(v, Violation::OverCap { running: 3, .. })),
            "{found:?}"
        );
    }

    #[test]
    fn merges_are_accounted_for_and_a_lost_merge_is_caught() {
        let mut history = good();
        // a2 merged into a3: a2 never starts, a3's prompt holds both.
        history.accepted.push(accepted("a3", "a", 2));
        history.engines.remove(1);
        history.engines.push(EngineSpan {
            run_id: "a3".into(),
            prompt_runs: vec!["a2".into(), "a3".into()],
            start_ns: 10,
            end_ns: Some(20),
        });
        history.completions[1].merged_into = Some("a3".into());
        history.completions.push(done("a3"));
        assert_eq!(history.check(), Vec::new());
        history.engines.last_mut().unwrap().prompt_runs = vec!["a3".into()];
        assert_eq!(
            history.check(),
            vec![Violation::LostInMerge { run_id: "a2".into(), into: "a3".into() }]
        );
    }

    #[test]
    fn two_pollers_at_once_are_caught_unless_the_first_node_was_down() {
        let mut history = good();
        history.polls.push(Poll { node: "n3".into(), start_ns: 15, end_ns: Some(40) });
        assert_eq!(
            history.check(),
            vec![Violation::TwoPollers { first: "n2".into(), second: "n3".into(), at_ns: 15 }]
        );
        // n2 was stopped at 12: its open poll no longer counts from then.
        history.down.push(Down { node: "n2".into(), from_ns: 12, to_ns: Some(50) });
        assert_eq!(history.check(), Vec::new());
        // A poll that never got an answer, of a node that never went down, is
        // open to the end.
        history.polls.push(Poll { node: "n1".into(), start_ns: 60, end_ns: None });
        history.polls.push(Poll { node: "n2".into(), start_ns: 70, end_ns: Some(80) });
        assert_eq!(
            history.check(),
            vec![Violation::TwoPollers { first: "n1".into(), second: "n2".into(), at_ns: 70 }]
        );
    }

    #[test]
    fn a_follower_missing_or_repeating_an_event_is_caught() {
        for seen in [vec![1, 3], vec![1, 2, 2, 3], vec![1, 3, 2]] {
            let mut history = good();
            history.follows[0].seen = seen.clone();
            assert_eq!(
                history.check(),
                vec![Violation::Followed { run_id: "a1".into(), seen, stored: vec![1, 2, 3] }]
            );
        }
    }

    #[test]
    fn the_run_log_pairs_starts_with_the_ends_of_the_same_process() {
        let log =
            "start 100 7 r1\nstart 105 8 r2 r3\nend 110 8 exited\nend 120 7 killed\nstart 130 9\n";
        assert_eq!(
            engine_spans(log),
            vec![
                EngineSpan {
                    run_id: "r1".into(),
                    prompt_runs: vec!["r1".into()],
                    start_ns: 100,
                    end_ns: Some(120)
                },
                EngineSpan {
                    run_id: "r3".into(),
                    prompt_runs: vec!["r2".into(), "r3".into()],
                    start_ns: 105,
                    end_ns: Some(110)
                },
            ]
        );
    }

    #[test]
    fn the_monotonic_clock_moves_forward() {
        let first = monotonic_ns();
        let second = monotonic_ns();
        assert!(first > 0 && second >= first);
    }
}
