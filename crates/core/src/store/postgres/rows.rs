//! Rows read back into the store's types: runs, journal entries, events and
//! usage sums, with the same checks as SQLite's (a JSON column that does not
//! read is [`StoreError::Corrupt`], a journal route of another shape is the
//! default route).

use serde::Deserialize;
use tokio_postgres::Row;

use super::super::{
    JournalEntry, JournalRoute, JournalState, RunRecord, StoreError, StoredEvent, UsageTotals,
};
use crate::budget::usage::RunSpend;
use crate::bus::RunStatus;
use crate::engine::ResumeToken;
use crate::ids::RunId;

/// Why a read failed: the driver (which may be worth another try on another
/// connection), or what the rows hold.
#[derive(Debug)]
pub(super) enum ReadError {
    Driver(tokio_postgres::Error),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for ReadError {
    fn from(error: tokio_postgres::Error) -> Self {
        ReadError::Driver(error)
    }
}

impl From<StoreError> for ReadError {
    fn from(error: StoreError) -> Self {
        ReadError::Store(error)
    }
}

pub(super) fn parse_json(
    text: &str,
    what: impl FnOnce() -> String,
) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("{}: {e}", what())))
}

/// The spend in the five columns from `first` on.
fn spend_from_row(row: &Row, first: usize) -> Result<RunSpend, ReadError> {
    let tokens = |i: usize| -> Result<u64, ReadError> {
        Ok(u64::try_from(row.try_get::<_, i64>(first + i)?).unwrap_or(0))
    };
    Ok(RunSpend {
        input_tokens: tokens(0)?,
        output_tokens: tokens(1)?,
        cache_read_tokens: tokens(2)?,
        cache_write_tokens: tokens(3)?,
        usd: row.try_get(first + 4)?,
    })
}

/// A usage row: the run count at `first`, then the spend.
pub(super) fn totals_from_row(row: &Row, first: usize) -> Result<UsageTotals, ReadError> {
    let runs: i64 = row.try_get(first)?;
    Ok(UsageTotals {
        runs: u64::try_from(runs).unwrap_or(0),
        spend: spend_from_row(row, first + 1)?,
    })
}

/// A run from the columns of `run_columns!`, in order.
pub(super) fn run_from_row(row: &Row) -> Result<RunRecord, ReadError> {
    let run_id: String = row.try_get(0)?;
    let meta: String = row.try_get(5)?;
    let status: String = row.try_get(6)?;
    let resume_engine: Option<String> = row.try_get(10)?;
    let resume_value: Option<String> = row.try_get(11)?;
    let usage: String = row.try_get(12)?;
    let duration_ms: Option<i64> = row.try_get(16)?;
    let resumed_from_engine: Option<String> = row.try_get(17)?;
    let resumed_from_value: Option<String> = row.try_get(18)?;
    let compacted: Option<String> = row.try_get(24)?;
    Ok(RunRecord {
        session_key: row.try_get::<_, String>(1)?.into(),
        conversation: row.try_get(2)?,
        engine: row.try_get(3)?,
        prompt: row.try_get(4)?,
        meta: parse_json(&meta, || format!("meta of run {run_id}"))?,
        status: RunStatus::parse(&status)
            .ok_or_else(|| StoreError::Corrupt(format!("run {run_id} has status {status:?}")))?,
        answer: row.try_get(7)?,
        error: row.try_get(8)?,
        error_code: row.try_get(9)?,
        resumed_from: resumed_from_engine
            .zip(resumed_from_value)
            .map(|(engine, value)| ResumeToken { engine, value }),
        resume: resume_engine
            .zip(resume_value)
            .map(|(engine, value)| ResumeToken { engine, value }),
        usage: parse_json(&usage, || format!("usage of run {run_id}"))?,
        spend: spend_from_row(row, 19)?,
        created_at_ms: row.try_get(13)?,
        started_at_ms: row.try_get(14)?,
        completed_at_ms: row.try_get(15)?,
        duration_ms: duration_ms
            .map(|d| {
                u64::try_from(d)
                    .map_err(|_| StoreError::Corrupt(format!("run {run_id} has duration {d}")))
            })
            .transpose()?,
        compacted: compacted
            .map(|text| {
                serde_json::from_str(&text).map_err(|e| {
                    StoreError::Corrupt(format!("compacted events of run {run_id}: {e}"))
                })
            })
            .transpose()?,
        run_id,
    })
}

/// The fields of a stored event's JSON that the store itself reads back.
#[derive(Debug, Deserialize)]
struct StoredEventHead {
    index: u64,
    #[serde(rename = "type", default)]
    kind: String,
}

/// The events of one event row (`data`, the event's JSON; a row written as
/// several lines holds one event a line), appended to `events`.
pub(super) fn push_events(
    events: &mut Vec<StoredEvent>,
    run_id: &str,
    idx: i64,
    data: &str,
) -> Result<(), StoreError> {
    for line in data.split('\n') {
        let data = parse_json(line, || format!("event {idx} of run {run_id}"))?;
        let head = StoredEventHead::deserialize(&data)
            .map_err(|e| StoreError::Corrupt(format!("event {idx} of run {run_id}: {e}")))?;
        events.push(StoredEvent { index: head.index, kind: head.kind, data });
    }
    Ok(())
}

/// The route of a journal entry. Text that is not JSON is corrupt; JSON of another
/// shape (a key of the wrong type) is read as the default route with a warning.
fn journal_route(text: &str, run_id: &str) -> Result<JournalRoute, StoreError> {
    let value = parse_json(text, || format!("route of journal entry {run_id}"))?;
    Ok(JournalRoute::deserialize(&value).unwrap_or_else(|error| {
        tracing::warn!(%run_id, %error, "unreadable journal route; the default route is used");
        JournalRoute::default()
    }))
}

/// A journal entry from `run_id, seq, session_key, conversation, prompt, engine,
/// resume_engine, resume_value, cwd, meta, route, state, accepted_at_ms`.
pub(super) fn journal_from_row(row: &Row) -> Result<JournalEntry, ReadError> {
    let run_id: String = row.try_get(0)?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("journal entry {run_id}: {what}"));
    let seq: i64 = row.try_get(1)?;
    let resume_engine: Option<String> = row.try_get(6)?;
    let resume_value: Option<String> = row.try_get(7)?;
    let cwd: Option<String> = row.try_get(8)?;
    let meta: String = row.try_get(9)?;
    let route: String = row.try_get(10)?;
    let state: String = row.try_get(11)?;
    Ok(JournalEntry {
        run_id: RunId::parse(&run_id).ok_or_else(|| corrupt("bad run id"))?,
        seq: u64::try_from(seq).map_err(|_| corrupt("negative seq"))?,
        session_key: row.try_get::<_, String>(2)?.into(),
        conversation: row.try_get(3)?,
        prompt: row.try_get(4)?,
        engine: row.try_get(5)?,
        resume: resume_engine.zip(resume_value).map(|(e, v)| ResumeToken::new(e, v)),
        cwd: cwd.map(std::path::PathBuf::from),
        meta: parse_json(&meta, || format!("meta of journal entry {run_id}"))?,
        route: journal_route(&route, &run_id)?,
        state: JournalState::parse(&state).ok_or_else(|| corrupt("unknown state"))?,
        accepted_at_ms: row.try_get(12)?,
    })
}
