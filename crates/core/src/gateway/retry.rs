//! The zero-answer retry: a run that failed on an engine error before it
//! produced any answer is resubmitted once, in the same session, with a prompt
//! that says so.
//!
//! The gateway decides when the run ends ([`should_retry`]) and names the retry
//! in the failed run's completion (`retried_by`), so everyone following the
//! first run moves on to the retry and sees one answer, the retry's. The router
//! journals and queues the retry ([`retry_prompt`], [`retry_meta`]) before it
//! forgets the failed request.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::engine::{Completion, RunError};
use crate::ids::RunId;

/// Meta key of a retry: which attempt it is (1).
pub const ATTEMPT_KEY: &str = "zero_answer_retry_attempt";
/// Meta key of a retry: the run that failed.
pub const OF_RUN_KEY: &str = "zero_answer_retry_of_run";
/// Meta key of a retry: why that run failed.
pub const REASON_KEY: &str = "zero_answer_retry_reason";

/// At most this many retries per accepted request.
pub const MAX_ATTEMPTS: u64 = 1;

/// Whether a run that ended with `completion` is resubmitted: it failed, its
/// answer is blank, the error is the engine's own (not an overflow, a cancel or
/// interrupt, a timeout, a budget or a refusal to start), its prompt was not
/// blank, and it is not a retry already.
pub fn should_retry(completion: &Completion, prompt: &str, meta: &BTreeMap<String, Value>) -> bool {
    let retryable =
        matches!(completion.error, Some(RunError::Engine { .. } | RunError::EngineCrashed { .. }));
    let attempts = meta.get(ATTEMPT_KEY).and_then(Value::as_u64).unwrap_or(0);
    !completion.ok
        && retryable
        && completion.answer.trim().is_empty()
        && completion.artifacts.is_empty()
        && !prompt.trim().is_empty()
        && attempts < MAX_ATTEMPTS
}

/// The retry's run id: derived from the failed run's, so the same failure names
/// the same retry before and after a restart.
pub fn retry_run_id(failed: &RunId) -> RunId {
    RunId::parse(&format!("{failed}.retry")).unwrap_or_else(RunId::generate)
}

/// The reason recorded for a failure: its error text.
pub fn failure_reason(completion: &Completion) -> String {
    completion.error.as_ref().map_or_else(|| "no answer".to_owned(), ToString::to_string)
}

/// The retry's prompt: the notice, the failed run and its failure, then the
/// original request.
pub fn retry_prompt(failed: &RunId, reason: &str, original: &str) -> String {
    format!(
        "Retry notice: the previous attempt failed before producing an answer. \
         Continue the task: check for partially completed work before repeating \
         any step, then answer the original request.\n\
         Previous run: {failed}\n\
         Failure: {reason}\n\
         Original request:\n{original}"
    )
}

/// The retry's meta: the original request's, plus the attempt, the failed run
/// and the reason.
pub fn retry_meta(
    meta: &BTreeMap<String, Value>,
    failed: &RunId,
    reason: &str,
) -> BTreeMap<String, Value> {
    let attempt = meta.get(ATTEMPT_KEY).and_then(Value::as_u64).unwrap_or(0) + 1;
    let mut meta = meta.clone();
    meta.insert(ATTEMPT_KEY.to_owned(), attempt.into());
    meta.insert(OF_RUN_KEY.to_owned(), failed.as_str().into());
    meta.insert(REASON_KEY.to_owned(), reason.into());
    meta
}

#[cfg(test)]
mod tests;
