use serde_json::json;

use super::input::{patch_from_json, spec_from_json, InputError};
use super::*;

fn object(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    value.as_object().unwrap().clone()
}

#[test]
fn outputs_are_cut_at_a_character_limit() {
    assert_eq!(truncate("short", 10), "short");
    assert_eq!(truncate("ééééé", 3), "ééé…");
    assert_eq!(truncate(&"x".repeat(600), OUTPUT_LIMIT).chars().count(), OUTPUT_LIMIT + 1);
}

#[test]
fn the_agent_comes_from_an_agent_session_key() {
    assert_eq!(agent_of("agent:ops:telegram:1:dm:2"), Some("ops"));
    assert_eq!(agent_of("agent::main"), None);
    assert_eq!(agent_of("webhook:x"), None);
}

#[test]
fn specs_take_camel_and_snake_case_and_message_for_prompt() {
    let spec = spec_from_json(&object(json!({
        "schedule": "every 30m", "message": "hi", "session_key": "agent:a:main",
        "jitterSec": 5, "timeout_ms": 1000, "maxRetries": 2, "retry_backoff_ms": 10,
        "enabled": false, "timezone": "UTC", "memoryFile": "notes.md", "meta": {"k": 1},
    })))
    .unwrap();
    assert_eq!(spec.prompt, "hi");
    assert_eq!(spec.session_key.as_str(), "agent:a:main");
    assert_eq!(
        (spec.jitter_sec, spec.timeout_ms, spec.max_retries, spec.retry_backoff_ms),
        (Some(5), Some(1000), Some(2), Some(10))
    );
    assert_eq!(spec.enabled, Some(false));
    assert_eq!(spec.memory_file.as_deref(), Some("notes.md"));
    let spec =
        spec_from_json(&object(json!({"schedule": "@daily", "prompt": "p", "agentId": "ops"})))
            .unwrap();
    assert_eq!(spec.session_key.as_str(), "agent:ops:main");

    let check = |value: serde_json::Value, expected: &str| {
        let error = spec_from_json(&object(value)).unwrap_err();
        assert_eq!(error.to_string(), expected);
    };
    check(json!({"prompt": "p"}), "schedule is required");
    check(json!({"schedule": "@daily", "prompt": " "}), "prompt is required");
    check(json!({"schedule": 5, "prompt": "p"}), "schedule must be a string");
    check(
        json!({"schedule": "@daily", "prompt": "p", "jitterSec": -1}),
        "jitterSec must be a non-negative integer",
    );
    check(
        json!({"schedule": "@daily", "prompt": "p", "enabled": "yes"}),
        "enabled must be true or false",
    );
    check(json!({"schedule": "@daily", "prompt": "p", "meta": []}), "meta must be an object");
    check(
        json!({"schedule": "@daily", "prompt": "p", "sessionKey": "a\u{7}b"}),
        "sessionKey must be a valid Lemon session key",
    );
    assert_eq!(
        spec_from_json(&object(json!({"schedule": "@daily"}))),
        Err(InputError::Missing("prompt"))
    );
}

#[test]
fn patches_carry_only_what_is_given() {
    assert!(patch_from_json(&object(json!({"id": "x", "action": "update"}))).unwrap().is_empty());
    let patch = patch_from_json(&object(json!({"enabled": false, "retryBackoffMs": 5}))).unwrap();
    assert_eq!(
        patch,
        JobPatch { enabled: Some(false), retry_backoff_ms: Some(5), ..JobPatch::default() }
    );
}

#[test]
fn a_job_has_one_json_form_with_the_reference_keys() {
    let job = scheduler::build_job(
        "cron_1".to_owned(),
        JobSpec::new("every 5 minutes", "p", "agent:a:main".into()),
        JobSource::Api,
        7,
    )
    .unwrap();
    let value = job.to_json();
    let keys: Vec<&str> = value.as_object().unwrap().keys().map(String::as_str).collect();
    for key in [
        "id",
        "name",
        "schedule",
        "enabled",
        "agentId",
        "sessionKey",
        "prompt",
        "memoryFile",
        "timezone",
        "jitterSec",
        "timeoutMs",
        "maxRetries",
        "retryBackoffMs",
        "createdAtMs",
        "updatedAtMs",
        "lastRunAtMs",
        "nextRunAtMs",
    ] {
        assert!(keys.contains(&key), "{key} missing from {keys:?}");
    }
    assert_eq!(value["schedule"], "*/5 * * * *");
    assert_eq!(value["timeoutMs"], DEFAULT_TIMEOUT_MS);
    assert_eq!(value["retryBackoffMs"], DEFAULT_RETRY_BACKOFF_MS);
    assert_eq!(value["maxRetries"], 0);
    assert_eq!(value["timezone"], "UTC");
    assert_eq!(value["agentId"], "a");
}
