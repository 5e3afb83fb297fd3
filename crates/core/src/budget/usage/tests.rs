//! Usage shapes of every vendor, and pricing.

use serde_json::json;

use super::*;

fn check(usage: serde_json::Value, expected: ReportedUsage) {
    assert_eq!(ReportedUsage::from_json(&usage), expected, "{usage}");
}

#[test]
fn every_vendor_shape_normalises() {
    check(
        json!({"total_cost_usd": 0.004, "num_turns": 2, "usage": {"input_tokens": 20,
            "output_tokens": 9, "cache_creation_input_tokens": 3, "cache_read_input_tokens": 5}}),
        ReportedUsage {
            input_tokens: 20,
            output_tokens: 9,
            cache_read_tokens: 5,
            cache_write_tokens: 3,
            usd: Some(0.004),
        },
    );
    check(
        json!({"input_tokens": 100, "cached_input_tokens": 50, "output_tokens": 200}),
        ReportedUsage {
            input_tokens: 50,
            output_tokens: 200,
            cache_read_tokens: 50,
            ..ReportedUsage::default()
        },
    );
    check(
        json!({"input": 900, "output": 40, "cacheRead": 7, "cacheWrite": 1, "totalTokens": 948,
            "cost": {"input": 0.1, "total": 0.25}}),
        ReportedUsage {
            input_tokens: 900,
            output_tokens: 40,
            cache_read_tokens: 7,
            cache_write_tokens: 1,
            usd: Some(0.25),
        },
    );
    check(
        json!({"tokens": {"input": 1200, "output": 80, "reasoning": 5, "cache": {"read": 2, "write": 3}},
            "cost": 0.5}),
        ReportedUsage {
            input_tokens: 1200,
            output_tokens: 85,
            cache_read_tokens: 2,
            cache_write_tokens: 3,
            usd: Some(0.5),
        },
    );
    check(
        json!({"prompt_tokens": 10, "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 6}}),
        ReportedUsage {
            input_tokens: 4,
            output_tokens: 4,
            cache_read_tokens: 6,
            ..ReportedUsage::default()
        },
    );
}

#[test]
fn nothing_usable_is_nothing_spent() {
    for usage in [
        json!(null),
        json!("12 tokens"),
        json!({"num_turns": 3, "duration_ms": 10}),
        json!({"input_tokens": -4, "output_tokens": "many", "total_cost_usd": -1.0}),
    ] {
        check(usage, ReportedUsage::default());
    }
}

fn price(input: f64, output: f64) -> ModelPrice {
    ModelPrice {
        input_per_mtok: input,
        output_per_mtok: output,
        cache_read_per_mtok: None,
        cache_write_per_mtok: None,
    }
}

#[test]
fn tokens_are_priced_per_million_and_a_reported_cost_wins() {
    let reported = ReportedUsage {
        input_tokens: 1_000_000,
        output_tokens: 500_000,
        cache_read_tokens: 2_000_000,
        ..ReportedUsage::default()
    };
    let spend = RunSpend::from_reported(&reported, Some(&price(3.0, 15.0)));
    // Cache reads cost the input price unless priced themselves.
    assert!((spend.usd - (3.0 + 7.5 + 6.0)).abs() < 1e-9, "{}", spend.usd);
    assert_eq!(spend.tokens(), 1_500_000);
    let cheap_cache = ModelPrice { cache_read_per_mtok: Some(0.3), ..price(3.0, 15.0) };
    let spend = RunSpend::from_reported(&reported, Some(&cheap_cache));
    assert!((spend.usd - (3.0 + 7.5 + 0.6)).abs() < 1e-9, "{}", spend.usd);

    let with_cost = ReportedUsage { usd: Some(0.25), ..reported };
    assert_eq!(RunSpend::from_reported(&with_cost, Some(&price(3.0, 15.0))).usd, 0.25);
    assert_eq!(RunSpend::from_reported(&reported, None).usd, 0.0, "no price, no figure");
    // A vendor that reports 0 for a model it cannot price is priced from the config.
    let zero = ReportedUsage { usd: Some(0.0), ..reported };
    assert!(RunSpend::from_reported(&zero, Some(&price(3.0, 15.0))).usd > 16.0);
    assert_eq!(RunSpend::from_reported(&zero, None).usd, 0.0);
}
