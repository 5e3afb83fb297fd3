//! Tests of what an edit changes and how the config is reported.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use lemon_core::config::{load_str, GatewayConfig};
use lemon_engines::config::EngineSections;

use super::{effective_json, pending_restarts, plan, settle, Plan, Settle, EMPTY_SETTLE};

fn gateway(text: &str) -> GatewayConfig {
    load_str(text, Path::new("/tmp/config.toml")).expect("valid config").config.gateway
}

#[test]
fn an_unchanged_config_plans_nothing() {
    let text = "[gateway]\nmax_concurrent_runs = 3\n[gateway.engines.echo]\ndelay_ms = 5\n";
    let plan = plan(&gateway(text), &gateway(&format!("# a comment\n{text}")));
    assert_eq!(plan, Plan::default());
    assert!(plan.is_empty());
}

#[test]
fn each_key_goes_to_the_component_that_owns_it() {
    let base = gateway("");
    let cap = plan(&base, &gateway("[gateway]\nmax_concurrent_runs = 5\n"));
    assert_eq!(cap.applied, ["max_concurrent_runs"]);
    assert!(cap.runtime && !cap.router && !cap.engines && !cap.webhook && !cap.telegram);

    let engine = plan(&base, &gateway("[gateway]\ndefault_engine = \"claude\"\n"));
    assert_eq!(engine.applied, ["default_engine"]);
    assert!(engine.router && !engine.runtime);

    let engines = plan(&base, &gateway("[gateway.engines.codex]\ncancel_grace_ms = 100\n"));
    assert_eq!(engines.applied, ["engines"]);
    assert!(engines.engines && engines.runtime);

    let webhook = plan(&base, &gateway("[gateway.webhook]\nenabled = false\n"));
    assert_eq!(webhook.applied, ["webhook"]);
    assert!(webhook.webhook && !webhook.telegram);

    let bindings =
        plan(&base, &gateway("[[gateway.bindings]]\ntransport = \"telegram\"\nchat_id = 5\n"));
    assert_eq!(bindings.applied, ["bindings"]);
    assert!(bindings.router && bindings.telegram);

    let grace = plan(&base, &gateway("[gateway]\nshutdown_grace_ms = 5\n"));
    assert_eq!(grace.applied, ["shutdown_grace_ms"]);
    assert!(grace.shutdown_grace);

    let watchdog =
        plan(&base, &gateway("[gateway]\nrun_idle_watchdog_ms = 0\n[gateway.queue]\ncap = 3\n"));
    assert_eq!(watchdog.applied, ["run_idle_watchdog_ms", "queue"]);
    assert!(watchdog.router);

    let rules = "[[gateway.approvals.rules]]\ntool = \"bash\"\naction = \"deny\"\n";
    let approvals = plan(&base, &gateway(rules));
    assert_eq!(approvals.applied, ["approvals"]);
    assert!(approvals.approvals && !approvals.runtime && !approvals.engines);
}

/// Every key of `[gateway]` is either applied live or listed as waiting
/// for a restart: an edit is never silently ignored.
#[test]
fn every_gateway_key_is_live_or_waits_for_a_restart() {
    let keys = super::raw_json(&gateway(""));
    let unhandled: Vec<&String> = keys
        .keys()
        .filter(|key| !super::LIVE_KEYS.contains(&key.as_str()))
        .filter(|key| !super::RESTART_KEYS.contains(&key.as_str()))
        .collect();
    assert!(unhandled.is_empty(), "keys neither live nor restart: {unhandled:?}");
    let sandbox = pending_restarts(&gateway(""), &gateway("[gateway.sandbox]\nmode = \"off\"\n"));
    assert_eq!(sandbox.len(), 1, "{sandbox:?}");
    assert_eq!(sandbox[0].key, "gateway.sandbox.mode");
}

#[test]
fn listeners_and_http_limits_wait_for_a_restart() {
    let started = gateway("[gateway.api]\nport = 4040\n");
    let edited = gateway(
        "[gateway.api]\nport = 5050\n[gateway]\nhttp_idle_timeout_ms = 99\nworker_threads = 3\n",
    );
    assert!(plan(&started, &edited).is_empty(), "nothing of it applies live");
    let pending = pending_restarts(&started, &edited);
    let keys: Vec<&str> = pending.iter().map(|p| p.key.as_str()).collect();
    assert_eq!(
        keys,
        ["gateway.api.port", "gateway.http_idle_timeout_ms", "gateway.worker_threads"]
    );
    assert_eq!(pending[0].running, serde_json::json!(4040));
    assert_eq!(pending[0].file, serde_json::json!(5050));
    // Set back, nothing waits any more.
    assert!(pending_restarts(&started, &gateway("[gateway.api]\nport = 4040\n")).is_empty());
}

#[test]
fn the_effective_config_has_defaults_and_no_secrets() {
    let config = gateway(
        "[gateway.webhook]\nenabled = true\ntoken = \"hunter2-hunter2\"\nallow_query_token = true\n\
         [gateway.webhook.integrations.ci]\ntoken_secret = \"ci_token\"\n\
         [gateway.telegram]\nbot_token = \"123:abcdef\"\n\
         [gateway.engines.claude]\nenv = { ANTHROPIC_API_KEY = \"sk-live\" }\napi_key_secret = \"anthropic\"\n",
    );
    let sections = EngineSections::parse(&config.engines, Path::new("/tmp/config.toml"), "")
        .expect("valid engine sections");
    let effective = effective_json(&config, &sections);
    let text = effective.to_string();
    for secret in ["hunter2-hunter2", "123:abcdef", "sk-live"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
    assert_eq!(effective["max_concurrent_runs"], 2, "defaults are filled in");
    assert_eq!(effective["webhook"]["token"], "[REDACTED]");
    assert_eq!(effective["webhook"]["allow_query_token"], true);
    assert_eq!(effective["webhook"]["integrations"]["ci"]["token_secret"], "ci_token");
    assert_eq!(effective["telegram"]["bot_token"], "[REDACTED]");
    assert_eq!(effective["engines"]["claude"]["env"]["ANTHROPIC_API_KEY"], "[REDACTED]");
    assert_eq!(effective["engines"]["claude"]["api_key_secret"], "anthropic");
    assert_eq!(effective["engines"]["claude"]["extra_args"], serde_json::json!([]), "as parsed");
}

/// The reference's inline secrets (`[gateway.sms] auth_token`, `[gateway.xmtp]
/// wallet_key` / `private_key`, email passwords and tokens) are never shown.
#[test]
fn the_reference_inline_secrets_are_not_in_the_effective_config() {
    let config = gateway(
        "[gateway.sms]\nauth_token = \"twilio-inline\"\n\
         [gateway.xmtp]\nwallet_key = \"0xwallet\"\nprivate_key = \"0xprivate\"\n\
         [gateway.email]\nsmtp_password = \"smtp-inline\"\nwebhook_token = \"hook-inline\"\n",
    );
    let sections = EngineSections::parse(&config.engines, Path::new("/tmp/config.toml"), "")
        .expect("valid engine sections");
    let text = effective_json(&config, &sections).to_string();
    for secret in ["twilio-inline", "0xwallet", "0xprivate", "smtp-inline", "hook-inline"] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
}

#[test]
fn a_file_that_turns_empty_is_taken_only_once_it_stays_empty() {
    let start = Instant::now();
    let mut since = None;
    let before = Some("[gateway]\nmax_concurrent_runs = 3\n");
    // An in-place save truncates first: the empty text waits.
    assert_eq!(settle("", before, &mut since, start), Settle::Wait(EMPTY_SETTLE));
    let later = start + Duration::from_millis(400);
    assert_eq!(
        settle(" \n", before, &mut since, later),
        Settle::Wait(EMPTY_SETTLE - Duration::from_millis(400))
    );
    // The new text arrives: taken at once, and the wait is forgotten.
    assert_eq!(settle("[gateway]\n", before, &mut since, later), Settle::Take);
    assert_eq!(since, None);
    // Emptied for good: taken once it has stayed empty long enough.
    assert!(matches!(settle("", before, &mut since, later), Settle::Wait(_)));
    assert_eq!(settle("", before, &mut since, later + EMPTY_SETTLE), Settle::Take);
    // A file that was empty before, or had none, is taken as it is.
    assert_eq!(settle("", Some(""), &mut None, start), Settle::Take);
    assert_eq!(settle("", None, &mut None, start), Settle::Take);
}
