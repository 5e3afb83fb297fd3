//! Rows read back into the store's types: runs, journal entries and usage
//! sums, through the columns both SQL backends share (`store::columns`).

use tokio_postgres::Row;

use super::super::columns;
use super::super::{JournalEntry, RunRecord, StoreError, UsageTotals};

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

/// A usage row: the run count at `first`, then the spend.
pub(super) fn totals_from_row(row: &Row, first: usize) -> Result<UsageTotals, ReadError> {
    let runs: i64 = row.try_get(first)?;
    let spend = columns::read_spend_columns!(first + 1, i => row.try_get(i)?);
    Ok(UsageTotals { runs: u64::try_from(runs).unwrap_or(0), spend: spend.spend() })
}

/// A run from the columns of `run_columns!`, in order.
pub(super) fn run_from_row(row: &Row) -> Result<RunRecord, ReadError> {
    Ok(columns::read_run_columns!(i => row.try_get(i)?).into_record()?)
}

/// A journal entry from `run_id, seq, session_key, conversation, prompt, engine,
/// resume_engine, resume_value, cwd, meta, route, state, accepted_at_ms`.
pub(super) fn journal_from_row(row: &Row) -> Result<JournalEntry, ReadError> {
    Ok(columns::read_journal_columns!(i => row.try_get(i)?).into_entry()?)
}
