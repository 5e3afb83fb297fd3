//! Spending limits: the check an engine makes between model turns, so a
//! session stops at the token or dollar budget its owner set.

use std::fmt;

use async_trait::async_trait;

use crate::ids::{RunId, SessionKey};

/// Tokens a run has used so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Whose spending a check is about.
#[derive(Debug, Clone, Copy)]
pub struct BudgetScope<'a> {
    pub run_id: &'a RunId,
    pub session_key: &'a SessionKey,
    pub engine: &'a str,
    pub model: &'a str,
}

/// A limit that has been reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget exceeded: {limit} (limit {allowed}, spent {spent})")]
pub struct BudgetExceeded {
    /// Which limit: `run tokens`, `session usd per day`, `daily usd`…
    pub limit: String,
    pub allowed: String,
    pub spent: String,
}

/// Answers whether a run may go on spending.
#[async_trait]
pub trait BudgetGuard: Send + Sync + fmt::Debug + 'static {
    /// Called before every model turn with what this run has used so far.
    ///
    /// # Errors
    /// [`BudgetExceeded`] naming the limit reached.
    async fn check(&self, scope: BudgetScope<'_>, run: TokenUsage) -> Result<(), BudgetExceeded>;
}
