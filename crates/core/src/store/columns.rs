//! Rows as both SQL backends read them back: the columns of a run, a journal
//! entry, a usage sum and an event, turned into the store's types with the
//! same checks whichever database they came from (a JSON column that does
//! not read is [`StoreError::Corrupt`], a journal route of another shape is
//! the default route with a warning).
//!
//! A backend reads a row's columns into [`RunColumns`] or [`JournalColumns`]
//! with [`read_run_columns!`] or [`read_journal_columns!`], giving the
//! expression that reads column `i` of its row type.

use serde::Deserialize;

use super::{
    action_summary, Compacted, JournalEntry, JournalRoute, JournalState, RunRecord, StoreError,
    StoredEvent,
};
use crate::budget::usage::RunSpend;
use crate::bus::RunStatus;
use crate::engine::ResumeToken;
use crate::ids::RunId;

/// The columns of a run, in the order both backends select them:
/// `run_id, session_key, conversation, engine, prompt, meta, status, answer,
/// error, error_code, resume_engine, resume_value, usage, created_at_ms,
/// started_at_ms, completed_at_ms, duration_ms, resumed_from_engine,
/// resumed_from_value, input_tokens, output_tokens, cache_read_tokens,
/// cache_write_tokens, cost_usd, compacted`.
pub(super) struct RunColumns {
    pub run_id: String,
    pub session_key: String,
    pub conversation: String,
    pub engine: String,
    pub prompt: String,
    pub meta: String,
    pub status: String,
    pub answer: Option<String>,
    pub error: Option<String>,
    pub error_code: Option<String>,
    pub resume_engine: Option<String>,
    pub resume_value: Option<String>,
    pub usage: String,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub completed_at_ms: Option<i64>,
    pub duration_ms: Option<i64>,
    pub resumed_from_engine: Option<String>,
    pub resumed_from_value: Option<String>,
    pub spend: SpendColumns,
    pub compacted: Option<String>,
}

/// Reads the columns of [`RunColumns`] with `$get`, an expression that reads
/// column `$i` (its type inferred from the field) or returns early.
macro_rules! read_run_columns {
    ($i:ident => $get:expr) => {
        $crate::store::columns::RunColumns {
            run_id: { let $i = 0; $get },
            session_key: { let $i = 1; $get },
            conversation: { let $i = 2; $get },
            engine: { let $i = 3; $get },
            prompt: { let $i = 4; $get },
            meta: { let $i = 5; $get },
            status: { let $i = 6; $get },
            answer: { let $i = 7; $get },
            error: { let $i = 8; $get },
            error_code: { let $i = 9; $get },
            resume_engine: { let $i = 10; $get },
            resume_value: { let $i = 11; $get },
            usage: { let $i = 12; $get },
            created_at_ms: { let $i = 13; $get },
            started_at_ms: { let $i = 14; $get },
            completed_at_ms: { let $i = 15; $get },
            duration_ms: { let $i = 16; $get },
            resumed_from_engine: { let $i = 17; $get },
            resumed_from_value: { let $i = 18; $get },
            spend: $crate::store::columns::read_spend_columns!(19, $i => $get),
            compacted: { let $i = 24; $get },
        }
    };
}

/// The five spend columns from `first` on: tokens in, out, cache read, cache
/// written, and US dollars.
pub(super) struct SpendColumns {
    pub tokens: [i64; 4],
    pub usd: f64,
}

/// Reads [`SpendColumns`] from column `$first` on, as [`read_run_columns!`].
macro_rules! read_spend_columns {
    ($first:expr, $i:ident => $get:expr) => {
        $crate::store::columns::SpendColumns {
            tokens: [
                {
                    let $i = $first;
                    $get
                },
                {
                    let $i = $first + 1;
                    $get
                },
                {
                    let $i = $first + 2;
                    $get
                },
                {
                    let $i = $first + 3;
                    $get
                },
            ],
            usd: {
                let $i = $first + 4;
                $get
            },
        }
    };
}

pub(super) use {read_run_columns, read_spend_columns};

impl SpendColumns {
    /// The spend; a negative count (never written) reads as 0.
    pub(super) fn spend(&self) -> RunSpend {
        let [input, output, cache_read, cache_write] =
            self.tokens.map(|n| u64::try_from(n).unwrap_or(0));
        RunSpend {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: cache_read,
            cache_write_tokens: cache_write,
            usd: self.usd,
        }
    }
}

impl RunColumns {
    /// The run these columns hold.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the run and the column that does not read.
    pub(super) fn into_record(self) -> Result<RunRecord, StoreError> {
        let run_id = self.run_id;
        let status = RunStatus::parse(&self.status).ok_or_else(|| {
            StoreError::Corrupt(format!("run {run_id} has status {:?}", self.status))
        })?;
        let token = |engine: Option<String>, value: Option<String>| {
            engine.zip(value).map(|(engine, value)| ResumeToken { engine, value })
        };
        Ok(RunRecord {
            session_key: self.session_key.into(),
            conversation: self.conversation,
            engine: self.engine,
            prompt: self.prompt,
            meta: parse_json(&self.meta, || format!("meta of run {run_id}"))?,
            status,
            answer: self.answer,
            error: self.error,
            error_code: self.error_code,
            resumed_from: token(self.resumed_from_engine, self.resumed_from_value),
            resume: token(self.resume_engine, self.resume_value),
            usage: parse_json(&self.usage, || format!("usage of run {run_id}"))?,
            spend: self.spend.spend(),
            created_at_ms: self.created_at_ms,
            started_at_ms: self.started_at_ms,
            completed_at_ms: self.completed_at_ms,
            duration_ms: self
                .duration_ms
                .map(|d| {
                    u64::try_from(d)
                        .map_err(|_| StoreError::Corrupt(format!("run {run_id} has duration {d}")))
                })
                .transpose()?,
            compacted: self
                .compacted
                .map(|text| {
                    serde_json::from_str(&text).map_err(|e| {
                        StoreError::Corrupt(format!("compacted events of run {run_id}: {e}"))
                    })
                })
                .transpose()?,
            run_id,
        })
    }
}

/// The columns of a journal entry, in the order both backends select them:
/// `run_id, seq, session_key, conversation, prompt, engine, resume_engine,
/// resume_value, cwd, meta, route, state, accepted_at_ms`.
pub(super) struct JournalColumns {
    pub run_id: String,
    pub seq: i64,
    pub session_key: String,
    pub conversation: String,
    pub prompt: String,
    pub engine: String,
    pub resume_engine: Option<String>,
    pub resume_value: Option<String>,
    pub cwd: Option<String>,
    pub meta: String,
    pub route: String,
    pub state: String,
    pub accepted_at_ms: i64,
}

/// Reads the columns of [`JournalColumns`], as [`read_run_columns!`].
macro_rules! read_journal_columns {
    ($i:ident => $get:expr) => {
        $crate::store::columns::JournalColumns {
            run_id: {
                let $i = 0;
                $get
            },
            seq: {
                let $i = 1;
                $get
            },
            session_key: {
                let $i = 2;
                $get
            },
            conversation: {
                let $i = 3;
                $get
            },
            prompt: {
                let $i = 4;
                $get
            },
            engine: {
                let $i = 5;
                $get
            },
            resume_engine: {
                let $i = 6;
                $get
            },
            resume_value: {
                let $i = 7;
                $get
            },
            cwd: {
                let $i = 8;
                $get
            },
            meta: {
                let $i = 9;
                $get
            },
            route: {
                let $i = 10;
                $get
            },
            state: {
                let $i = 11;
                $get
            },
            accepted_at_ms: {
                let $i = 12;
                $get
            },
        }
    };
}

pub(super) use read_journal_columns;

impl JournalColumns {
    /// The entry these columns hold.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] naming the entry and what does not read.
    pub(super) fn into_entry(self) -> Result<JournalEntry, StoreError> {
        let run_id = self.run_id;
        let corrupt = |what: &str| StoreError::Corrupt(format!("journal entry {run_id}: {what}"));
        Ok(JournalEntry {
            run_id: RunId::parse(&run_id).ok_or_else(|| corrupt("bad run id"))?,
            seq: u64::try_from(self.seq).map_err(|_| corrupt("negative seq"))?,
            session_key: self.session_key.into(),
            conversation: self.conversation,
            prompt: self.prompt,
            engine: self.engine,
            resume: self.resume_engine.zip(self.resume_value).map(|(e, v)| ResumeToken::new(e, v)),
            cwd: self.cwd.map(std::path::PathBuf::from),
            meta: parse_json(&self.meta, || format!("meta of journal entry {run_id}"))?,
            route: journal_route(&self.route, &run_id)?,
            state: JournalState::parse(&self.state).ok_or_else(|| corrupt("unknown state"))?,
            accepted_at_ms: self.accepted_at_ms,
        })
    }
}

/// A JSON column; text that does not read is corrupt, named by `what`.
pub(super) fn parse_json(
    text: &str,
    what: impl FnOnce() -> String,
) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{}: {e}", what())))
}

/// The route of a journal entry. Text that is not JSON is corrupt; JSON of another
/// shape (a key of the wrong type) is read as the default route with a warning,
/// as it was read before the route had a type.
fn journal_route(text: &str, run_id: &str) -> Result<JournalRoute, StoreError> {
    let value = parse_json(text, || format!("route of journal entry {run_id}"))?;
    Ok(JournalRoute::deserialize(&value).unwrap_or_else(|error| {
        tracing::warn!(%run_id, %error, "unreadable journal route; the default route is used");
        JournalRoute::default()
    }))
}

/// The fields of a stored event's JSON that the store itself reads back.
#[derive(Debug, Deserialize)]
struct StoredEventHead {
    index: u64,
    #[serde(rename = "type", default)]
    kind: String,
}

/// The events of one event row (`data`: one event's JSON a line; SQLite keeps
/// several consecutive events in a row), appended to `events`; `at` names the
/// row in an error.
///
/// # Errors
/// [`StoreError::Corrupt`] when a line is not an event's JSON.
pub(super) fn push_events(
    events: &mut Vec<StoredEvent>,
    run_id: &str,
    at: i64,
    data: &str,
) -> Result<(), StoreError> {
    for line in data.split('\n') {
        let data = parse_json(line, || format!("event row {at} of run {run_id}"))?;
        let head = StoredEventHead::deserialize(&data)
            .map_err(|e| StoreError::Corrupt(format!("event row {at} of run {run_id}: {e}")))?;
        events.push(StoredEvent { index: head.index, kind: head.kind, data });
    }
    Ok(())
}

/// What compaction makes of one run's event rows (their `data` column, in
/// index order).
pub(super) struct CompactedEvents {
    /// The run's last `run_completed`, marked `"compacted"`, with its index:
    /// the one event kept.
    pub kept: Option<(i64, String)>,
    /// The [`Compacted`] summary the run's record keeps, as JSON.
    pub summary: String,
}

/// Compacts a run's event rows at `now_ms`: every line counts as an event (a
/// line that does not read is counted and goes with the rest), the completed
/// actions are summarised, and the last `run_completed` is kept.
pub(super) fn compact_events(
    rows: impl IntoIterator<Item = String>,
    now_ms: i64,
) -> CompactedEvents {
    let mut events = Vec::new();
    let mut n_events = 0u64;
    for data in rows {
        for line in data.split('\n') {
            n_events += 1;
            if let Ok(event) = serde_json::from_str::<serde_json::Value>(line) {
                events.push(event);
            }
        }
    }
    let compacted = Compacted { at_ms: now_ms, events: n_events, actions: action_summary(&events) };
    let kept = events.into_iter().rfind(|e| e["type"] == "run_completed").map(|mut completed| {
        let index = completed["index"].as_i64().unwrap_or(0);
        completed["compacted"] = serde_json::json!({ "at_ms": now_ms, "events": n_events });
        (index, completed.to_string())
    });
    // A summary of plain JSON values always serialises.
    let summary = serde_json::to_string(&compacted).unwrap_or_default();
    CompactedEvents { kept, summary }
}
