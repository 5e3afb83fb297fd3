//! Events of runs on other nodes, for local followers.
//!
//! A run's events are published on the bus of the node that runs it. A
//! follower on another node (an SSE client, a channel delivering the answer)
//! subscribes to the run's topic on its own node's bus and reads the run's
//! stored events; live ones would never come. The relay brings them: for
//! every run someone follows on this node's bus that this node does not run
//! itself, it reads the events stored after the last one it relayed and
//! publishes them on the run's topic ([`EventBus::relay`]) with their own
//! index and session key, the last one being `run_completed`, which closes the
//! topic. The follower joins them with what it read from the store by index,
//! so an event both read and relayed is handed out once.
//!
//! It reads when a [`Topic::Events`] notification names a relayed run past
//! the last index relayed, and for every relayed run at each sweep
//! ([`ClusterSettings::sweep`](super::ClusterSettings::sweep)) and whenever
//! notifications may have been missed (the listener connected again, or the
//! relay fell behind the notices). A run it first relays is read from its
//! first event: its followers drop what they already have.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::ClusterNode;
use crate::bus::{BusEvent, EventBus, EventKind};
use crate::cluster::{ClusterError, Notice, Topic};
use crate::ids::RunId;

/// Most event rows one read returns; what is left is read at once after.
const READ_LIMIT: usize = 1024;

/// Most notices taken together into one read.
const NOTICE_BATCH: usize = 256;

/// The events of each run after the index given for it, in index order.
const EVENTS_AFTER: &str = "SELECT e.run_id, e.idx, e.data
    FROM unnest($1::text[], $2::bigint[]) AS c(run_id, after)
    JOIN run_events e ON e.run_id = c.run_id AND e.idx > c.after
    ORDER BY e.run_id, e.idx LIMIT $3";

/// Starts relaying the events of runs that other nodes run to this node's
/// followers on `bus`, until `token` is cancelled.
pub fn spawn_relay(
    node: Arc<ClusterNode>,
    bus: EventBus,
    tracker: &TaskTracker,
    token: CancellationToken,
) {
    let relay = Relay { node, bus, relayed: HashMap::new(), failing: false };
    tracker.spawn(relay.run(token));
}

/// The relay's state, owned by its task.
struct Relay {
    node: Arc<ClusterNode>,
    bus: EventBus,
    /// Every run relayed, with the highest index published for it (0: none).
    relayed: HashMap<RunId, u64>,
    /// The last read failed (it is logged once until one succeeds).
    failing: bool,
}

/// Which runs to read.
#[derive(Debug, PartialEq, Eq)]
enum Due {
    /// Every relayed run: a sweep, or notifications may have been missed.
    All,
    /// The runs notified, each with the highest index a notification named.
    Runs(HashMap<String, u64>),
}

impl Due {
    /// Adds what `notice` says.
    fn note(&mut self, notice: Notice) {
        match notice {
            Notice::Resync => *self = Due::All,
            Notice::Notified { topic: Topic::Events, payload } => {
                let Due::Runs(runs) = self else { return };
                let Some((run_id, index)) = parse_payload(&payload) else {
                    tracing::debug!(payload, "unreadable event notification ignored");
                    return;
                };
                let max = runs.entry(run_id.to_owned()).or_insert(index);
                *max = (*max).max(index);
            }
            Notice::Notified { .. } => {}
        }
    }
}

/// A [`Topic::Events`] payload, `<run id>:<highest index>` (a run id may
/// itself hold a `:`).
fn parse_payload(payload: &str) -> Option<(&str, u64)> {
    let (run_id, index) = payload.rsplit_once(':')?;
    Some((run_id, index.parse().ok()?))
}

impl Relay {
    async fn run(mut self, token: CancellationToken) {
        let mut notices = self.node.subscribe();
        let mut sweep = tokio::time::interval(self.node.settings().sweep);
        sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut listening = true;
        loop {
            let mut due = tokio::select! {
                () = token.cancelled() => return,
                _ = sweep.tick() => Due::All,
                notice = notices.recv(), if listening => match notice {
                    Ok(notice) => {
                        let mut due = Due::Runs(HashMap::new());
                        due.note(notice);
                        due
                    }
                    Err(RecvError::Lagged(_)) => Due::All,
                    Err(RecvError::Closed) => {
                        // The node stopped listening: sweeps alone from now on.
                        listening = false;
                        continue;
                    }
                },
            };
            for _ in 0..NOTICE_BATCH {
                match notices.try_recv() {
                    Ok(notice) => due.note(notice),
                    Err(TryRecvError::Lagged(_)) => due = Due::All,
                    Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                }
            }
            tokio::select! {
                () = token.cancelled() => return,
                () = self.relay(due) => {}
            }
        }
    }

    /// Reads and publishes what is `due`.
    async fn relay(&mut self, due: Due) {
        self.track();
        let mut wanted: Vec<(RunId, u64)> = match due {
            Due::All => self.relayed.iter().map(|(run, after)| (run.clone(), *after)).collect(),
            Due::Runs(notified) => notified
                .into_iter()
                .filter_map(|(run, max)| {
                    let (run, after) = self.relayed.get_key_value(run.as_str())?;
                    (max > *after).then(|| (run.clone(), *after))
                })
                .collect(),
        };
        while !wanted.is_empty() {
            let rows = match self.read(&wanted).await {
                Ok(rows) => rows,
                Err(error) => {
                    if !self.failing {
                        tracing::warn!(%error, "could not read the events of runs on other nodes; trying again at the next sweep");
                    }
                    self.failing = true;
                    return;
                }
            };
            if std::mem::take(&mut self.failing) {
                tracing::info!("events of runs on other nodes read again");
            }
            let more = rows.len() >= READ_LIMIT;
            for (run_id, index, data) in rows {
                self.publish(&run_id, index, &data);
            }
            if !more {
                return;
            }
            wanted = wanted
                .into_iter()
                .filter_map(|(run, _)| {
                    let after = *self.relayed.get(&run)?;
                    Some((run, after))
                })
                .collect();
        }
    }

    /// Relays the runs someone follows here that this node does not run,
    /// and no others.
    fn track(&mut self) {
        let fences = self.node.fences();
        let followed: HashSet<RunId> = self
            .bus
            .watched_runs()
            .into_iter()
            .filter(|run| !fences.has_run(run.as_str()))
            .collect();
        self.relayed.retain(|run, _| followed.contains(run));
        for run in followed {
            self.relayed.entry(run).or_insert(0);
        }
    }

    /// The stored events of `wanted` runs after their indexes, up to [`READ_LIMIT`].
    async fn read(
        &self,
        wanted: &[(RunId, u64)],
    ) -> Result<Vec<(String, u64, String)>, ClusterError> {
        let run_ids: Vec<&str> = wanted.iter().map(|(run, _)| run.as_str()).collect();
        let after: Vec<i64> =
            wanted.iter().map(|(_, after)| i64::try_from(*after).unwrap_or(i64::MAX)).collect();
        let limit = i64::try_from(READ_LIMIT).unwrap_or(i64::MAX);
        self.node
            .cluster()
            .with_client(async |client| {
                let statement = client.prepare_cached(EVENTS_AFTER).await?;
                let rows = client.query(&statement, &[&run_ids, &after, &limit]).await?;
                let mut events = Vec::with_capacity(rows.len());
                for row in rows {
                    let index: i64 = row.try_get(1)?;
                    events.push((
                        row.try_get(0)?,
                        u64::try_from(index).unwrap_or(0),
                        row.try_get(2)?,
                    ));
                }
                Ok::<_, ClusterError>(events)
            })
            .await
    }

    /// Publishes one stored event of a relayed run, past the last one relayed.
    fn publish(&mut self, run_id: &str, index: u64, data: &str) {
        let Some(after) = self.relayed.get_mut(run_id) else { return };
        if index <= *after {
            return;
        }
        *after = index;
        let event = serde_json::from_str(data).ok().and_then(|json| BusEvent::from_json(&json));
        let Some(event) = event.filter(|event| event.index == index) else {
            // Followers find it in the store when they see the gap.
            tracing::debug!(run_id, index, "stored event not relayed: this version cannot read it");
            return;
        };
        let completed = matches!(event.kind, EventKind::RunCompleted { .. });
        self.bus.relay(Arc::new(event));
        if completed {
            self.relayed.remove(run_id);
        }
    }
}

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
