//! The plain-text answer of a finished run, for channels that send one message
//! when a run ends (email, XMTP): the answer, or what went wrong, then the
//! resume line.

use lemon_core::engine::{Completion, RunError};
use lemon_core::router::RouterHandle;

/// The text to send for `completion`; `None` when nothing is owed: a run this
/// channel did not start (`started == false`) that succeeded or was merged
/// into another job is answered by whoever started it.
pub fn plain_answer(
    router: &RouterHandle,
    completion: &Completion,
    started: bool,
) -> Option<String> {
    if !started && (completion.ok || matches!(completion.error, Some(RunError::Merged { .. }))) {
        return None;
    }
    let mut text = if completion.ok {
        completion.answer.trim().to_owned()
    } else {
        match &completion.error {
            Some(RunError::Cancelled { .. }) => "Cancelled.".to_owned(),
            Some(error) => format!("Error: {error}"),
            None => "Error: the run failed".to_owned(),
        }
    };
    if text.is_empty() {
        text = "Done.".to_owned();
    }
    if let Some(token) = &completion.resume {
        let line = router.query().format_resume(token);
        if !line.trim().is_empty() {
            text.push_str("\n\n");
            text.push_str(&line);
        }
    }
    Some(text)
}
