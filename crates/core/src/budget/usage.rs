//! What a run spent: the usage its engine reported, in whatever shape the
//! vendor prints it, normalised to tokens and US dollars.
//!
//! The shapes read (each CLI's translator keeps its vendor's keys):
//! - Claude: `{"total_cost_usd", "usage": {"input_tokens", "output_tokens",
//!   "cache_creation_input_tokens", "cache_read_input_tokens"}}`;
//! - Codex (and OpenAI): `{"input_tokens", "cached_input_tokens", "output_tokens"}`,
//!   where the cached tokens are part of the input tokens;
//! - Pi: `{"input", "output", "cacheRead", "cacheWrite", "cost": {"total"}}`;
//! - OpenCode: `{"tokens": {"input", "output", "reasoning", "cache": {"read",
//!   "write"}}, "cost"}`;
//! - OpenAI Chat Completions: `{"prompt_tokens", "completion_tokens"}`.
//!
//! A key that is missing or not a number counts as zero; an engine that reports
//! nothing (Droid, echo) spent nothing that can be counted.

use serde_json::Value;

use crate::config::ModelPrice;

/// Tokens and dollars, normalised: input tokens exclude those read from or
/// written to a prompt cache, which are counted apart.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RunSpend {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// US dollars: the engine's own figure when it reports one, else priced
    /// from `[gateway.budgets.prices]`, else 0.
    pub usd: f64,
}

impl RunSpend {
    /// The tokens token limits count: input plus output (cache traffic is
    /// reported, and priced, but not counted against a token limit).
    pub fn tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// The sum of two spends.
    pub fn plus(&self, other: &RunSpend) -> RunSpend {
        RunSpend {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cache_read_tokens: self.cache_read_tokens.saturating_add(other.cache_read_tokens),
            cache_write_tokens: self.cache_write_tokens.saturating_add(other.cache_write_tokens),
            usd: self.usd + other.usd,
        }
    }

    /// The spend of `reported`: its own cost, else priced with `price`.
    pub fn from_reported(reported: &ReportedUsage, price: Option<&ModelPrice>) -> RunSpend {
        let mut spend = RunSpend {
            input_tokens: reported.input_tokens,
            output_tokens: reported.output_tokens,
            cache_read_tokens: reported.cache_read_tokens,
            cache_write_tokens: reported.cache_write_tokens,
            usd: 0.0,
        };
        spend.usd = match (reported.usd, price) {
            // A zero cost with a configured price is a vendor that does not
            // know the model's price (OpenCode reports 0 then).
            (Some(usd), Some(price)) if usd <= 0.0 => priced(&spend, price),
            (Some(usd), _) => usd,
            (None, Some(price)) => priced(&spend, price),
            (None, None) => 0.0,
        };
        spend
    }
}

/// The dollars `spend`'s tokens cost at `price`.
pub fn priced(spend: &RunSpend, price: &ModelPrice) -> f64 {
    let per_token = |per_mtok: f64, tokens: u64| per_mtok * tokens as f64 / 1_000_000.0;
    per_token(price.input_per_mtok, spend.input_tokens)
        + per_token(price.output_per_mtok, spend.output_tokens)
        + per_token(
            price.cache_read_per_mtok.unwrap_or(price.input_per_mtok),
            spend.cache_read_tokens,
        )
        + per_token(
            price.cache_write_per_mtok.unwrap_or(price.input_per_mtok),
            spend.cache_write_tokens,
        )
}

/// Usage as an engine reported it, normalised, before pricing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ReportedUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
    /// The engine's own cost figure, when it gives one.
    pub usd: Option<f64>,
}

impl ReportedUsage {
    /// Reads a completion's `usage` JSON in any of the shapes above.
    pub fn from_json(usage: &Value) -> ReportedUsage {
        let Some(top) = usage.as_object() else { return ReportedUsage::default() };
        // Claude nests its counts under `usage`, OpenCode under `tokens`.
        let counts = ["usage", "tokens"]
            .iter()
            .find_map(|key| top.get(*key).filter(|v| v.is_object()))
            .unwrap_or(usage);
        let first = |keys: &[&str]| keys.iter().find_map(|key| count(counts.get(*key)));
        let nested = |outer: &str, inner: &str| count(counts.get(outer).and_then(|v| v.get(inner)));
        let mut input = first(&["input_tokens", "input", "prompt_tokens"]).unwrap_or(0);
        let output = first(&["output_tokens", "output", "completion_tokens"]).unwrap_or(0)
            + count(counts.get("reasoning")).unwrap_or(0);
        // OpenAI's cached tokens are a part of its input tokens.
        let openai_cached = first(&["cached_input_tokens"])
            .or_else(|| nested("prompt_tokens_details", "cached_tokens"))
            .or_else(|| nested("input_tokens_details", "cached_tokens"));
        let cache_read = match openai_cached {
            Some(cached) => {
                let cached = cached.min(input);
                input -= cached;
                cached
            }
            None => first(&["cache_read_input_tokens", "cacheRead"])
                .or_else(|| nested("cache", "read"))
                .unwrap_or(0),
        };
        let cache_write = first(&["cache_creation_input_tokens", "cacheWrite"])
            .or_else(|| nested("cache", "write"))
            .unwrap_or(0);
        let usd = ["total_cost_usd", "cost_usd", "cost"].iter().find_map(|key| {
            let value = top.get(*key).or_else(|| counts.get(*key))?;
            dollars(value).or_else(|| dollars(value.get("total")?))
        });
        ReportedUsage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: cache_read,
            cache_write_tokens: cache_write,
            usd,
        }
    }
}

fn count(value: Option<&Value>) -> Option<u64> {
    let value = value?;
    value
        .as_u64()
        .or_else(|| value.as_f64().filter(|f| f.is_finite() && *f >= 0.0).map(|f| f as u64))
}

fn dollars(value: &Value) -> Option<f64> {
    value.as_f64().filter(|usd| usd.is_finite() && *usd >= 0.0)
}

#[cfg(test)]
mod tests;
