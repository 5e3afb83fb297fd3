//! Spending limits: the check an engine makes between model turns, so a
//! session stops at the token or dollar budget its owner set.
//!
//! [`usage`] turns what each engine reports into a [`usage::RunSpend`];
//! [`store_guard`] is the [`BudgetGuard`] over the store's totals that the
//! gateway checks before every run and hands to the engines.

pub mod store_guard;
pub mod usage;

use std::fmt;

use async_trait::async_trait;

use crate::config::SessionLimits;
use crate::ids::{RunId, SessionKey};
use usage::{ReportedUsage, RunSpend};

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

impl BudgetExceeded {
    /// The text of the run's `budget_exceeded` error: which limit, what was
    /// spent and what is allowed.
    pub fn detail(&self) -> String {
        format!("{} reached: spent {} of {}", self.limit, self.spent, self.allowed)
    }
}

/// Answers whether a run may go on spending.
#[async_trait]
pub trait BudgetGuard: Send + Sync + fmt::Debug + 'static {
    /// Called before every model turn with what this run has used so far.
    ///
    /// # Errors
    /// [`BudgetExceeded`] naming the limit reached.
    async fn check(&self, scope: BudgetScope<'_>, run: TokenUsage) -> Result<(), BudgetExceeded>;

    /// Called by the gateway before a run starts, with the limits of the
    /// binding its channel matched; the guard keeps them for the run's later
    /// checks until [`BudgetGuard::finish`]. The default checks with nothing
    /// spent yet.
    ///
    /// # Errors
    /// [`BudgetExceeded`] when the session (or the day) is already at a limit.
    async fn admit(
        &self,
        scope: BudgetScope<'_>,
        binding: Option<&SessionLimits>,
    ) -> Result<(), BudgetExceeded> {
        let _ = binding;
        self.check(scope, TokenUsage::default()).await
    }

    /// The run is over: what [`BudgetGuard::admit`] kept for it is dropped.
    fn finish(&self, run_id: &RunId) {
        let _ = run_id;
    }

    /// The US dollars a run starting now may spend under every dollar limit
    /// that applies to it; `None` when none does.
    async fn remaining_usd(&self, scope: BudgetScope<'_>) -> Option<f64> {
        let _ = scope;
        None
    }

    /// What a finished run spent, from its completion's `usage`; the default
    /// knows no prices.
    fn spend(&self, scope: BudgetScope<'_>, usage: &serde_json::Value) -> RunSpend {
        let _ = scope;
        RunSpend::from_reported(&ReportedUsage::from_json(usage), None)
    }
}
