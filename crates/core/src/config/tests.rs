//! Tests of the `config.toml` types and loader.

use std::path::{Path, PathBuf};

use super::*;

const FILE: &str = "/home/u/.lemon/config.toml";

fn load(text: &str) -> Result<LoadedConfig, ConfigError> {
    load_str(text, Path::new(FILE))
}

/// Loads `text`, which must give no error and exactly the `expect`ed warnings.
fn check_ok(text: &str, expect_warnings: &[&str]) -> Config {
    let loaded = match load(text) {
        Ok(loaded) => loaded,
        Err(e) => panic!("unexpected error: {e}\n--- input ---\n{text}"),
    };
    assert_eq!(loaded.warnings, expect_warnings, "warnings for\n{text}");
    loaded.config
}

/// Loads `text`, which must fail with exactly the `expect`ed message.
fn check_error(text: &str, expect: &str) {
    match load(text) {
        Ok(loaded) => {
            panic!("expected an error, loaded {:?}\n--- input ---\n{text}", loaded.config)
        }
        Err(e) => assert_eq!(e.to_string(), expect, "error for\n{text}"),
    }
}

#[test]
fn empty_file_gives_the_defaults() {
    let config = check_ok("", &[]);
    let gateway = &config.gateway;
    assert_eq!(gateway.max_concurrent_runs, 2);
    assert!(gateway.require_engine_lock);
    assert_eq!(gateway.engine_lock_timeout_ms, 60_000);
    assert_eq!(gateway.run_inactivity_timeout_ms, 300_000);
    assert_eq!(gateway.shutdown_grace_ms, 10_000);
    assert_eq!(gateway.default_engine, None, "unset: the gateway decides");
    assert_eq!(gateway.api.addr(DEFAULT_API_PORT), "127.0.0.1:4040");
    assert_eq!(gateway.health.addr(DEFAULT_HEALTH_PORT), "127.0.0.1:4042");
    assert_eq!(gateway.api_addr(), "127.0.0.1:4040");
    assert_eq!(gateway.health_addr(), "127.0.0.1:4042");
    assert!(
        gateway.engines.is_empty() && gateway.projects.is_empty() && gateway.bindings.is_empty()
    );
    // The README's defaults: a conversation holds 100 waiting requests and
    // refuses more; 10 000 unfinished requests in all.
    assert!(gateway.queue.mode.is_none() && gateway.queue.drop.is_none());
    assert_eq!(gateway.queue.cap, Some(100));
    assert_eq!(gateway.max_pending_runs, 10_000);
    assert_eq!(check_ok("[gateway.queue]\nmode = \"collect\"\n", &[]).gateway.queue.cap, Some(100));
    assert!(gateway.telegram.is_none() && gateway.sms.is_none() && gateway.voice.is_none());

    // An empty `[gateway]` table is the same as none.
    let config = check_ok("[gateway]\n", &[]);
    assert_eq!(config.gateway.max_concurrent_runs, 2);
    assert!(config.gateway.require_engine_lock);
}

#[test]
fn reference_example_loads_without_errors_or_warnings() {
    let config = check_ok(include_str!("reference_example.toml"), &[]);
    let gateway = &config.gateway;
    assert_eq!(gateway.max_concurrent_runs, 4);
    assert_eq!(gateway.default_engine.as_ref().unwrap(), "claude:opus");
    assert!(!gateway.require_engine_lock);
    assert_eq!(gateway.native_only, Some(false));
    assert_eq!(gateway.api_addr(), "127.0.0.1:4040");
    assert_eq!(gateway.health_addr(), "0.0.0.0:4042");
    let retention = crate::config::RetentionConfig {
        runs_days: 60,
        events_days: 3,
        max_db_mb: Some(4000),
        ..Default::default()
    };
    assert_eq!(gateway.retention, retention);
    // The defaults the README states.
    let defaults = crate::config::RetentionConfig::default();
    assert_eq!(
        (defaults.runs_days, defaults.events_days, defaults.usage_days, defaults.sessions_days),
        (30, 7, 400, 90)
    );
    assert_eq!((defaults.max_db_mb, defaults.cron_runs_kept), (None, 100));

    // The sections' own keys are read by lemon-engines (its tests load this file too).
    assert_eq!(gateway.engines.keys().collect::<Vec<_>>(), ["claude", "codex", "echo"]);
    assert_eq!(gateway.engine("echo").unwrap()["delay_ms"].as_integer(), Some(25));
    assert!(gateway.engine("pi").is_none());

    assert_eq!(
        gateway
            .project("myapp")
            .unwrap()
            .default_engine
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("codex")
    );
    assert_eq!(gateway.bindings.len(), 3);
    assert_eq!(gateway.bindings[1].topic_id.as_ref().and_then(|v| v.as_integer()), Some(123));
    assert_eq!(gateway.bindings[1].queue_mode, Some(QueueMode::Interrupt));
    assert_eq!(gateway.bindings[2].queue_mode, Some(QueueMode::SteerBacklog));
    assert_eq!(
        gateway.bindings[2].chat_id.as_ref().and_then(|v| v.as_str()),
        Some("987654321012345678")
    );

    // Channel sections are kept verbatim for their owners.
    let telegram = gateway.telegram.as_ref().unwrap();
    assert_eq!(telegram["compaction"]["trigger_ratio"].as_float(), Some(0.88));
    assert_eq!(telegram["files"]["outbound_send_delay_ms"].as_integer(), Some(800));
    let discord = gateway.discord.as_ref().unwrap();
    assert_eq!(discord["files"]["max_download_bytes"].as_integer(), Some(1234));
    let email = gateway.email.as_ref().unwrap();
    assert_eq!(email["outbound"]["relay"].as_str(), Some(" nested-relay.example.test "));
    assert_eq!(email["smtp_username"].as_str(), Some(" lemon "));
    let webhook = gateway.webhook.as_ref().unwrap();
    let n8n = &webhook["integrations"]["n8n-demo"];
    assert_eq!(n8n["queue_mode"].as_str(), Some("followup"));
    assert_eq!(n8n["allow_payload_token"].as_bool(), Some(false));
    let sms = gateway.sms.as_ref().unwrap();
    assert_eq!(sms["auth_token_secret"].as_str(), Some("twilio_auth_token"));
    assert_eq!(gateway.xmtp.as_ref().unwrap()["environment"].as_str(), Some("dev"));
    assert_eq!(gateway.voice.as_ref().unwrap()["websocket_port"].as_integer(), Some(4047));
}

#[test]
fn reference_config_loader_values() {
    let config = check_ok(
        r#"
[gateway]
max_concurrent_runs = 3
default_cwd = "/tmp"
enable_telegram = true
enable_xmtp = true

[gateway.sms]
webhook_port = 8786

[gateway.queue]
mode = "collect"
cap = 10
drop = "oldest"

[gateway.projects.demo]
root = "/tmp/demo"

[[gateway.bindings]]
transport = "telegram"
chat_id = 123
project = "demo"

[gateway.xmtp]
env = "dev"
wallet_address = "0xabc"
wallet_key = "0xdef"
poll_interval_ms = 1500
"#,
        &[],
    );
    let gateway = &config.gateway;
    assert_eq!(gateway.max_concurrent_runs, 3);
    assert_eq!(gateway.default_cwd.as_deref(), Some(Path::new("/tmp")));
    assert_eq!(gateway.enable_telegram, Some(true));
    assert_eq!(gateway.enable_xmtp, Some(true));
    assert_eq!(gateway.enable_discord, None);
    assert_eq!(gateway.queue.mode, Some(QueueMode::Collect));
    assert_eq!(gateway.queue.cap, Some(10));
    assert_eq!(gateway.queue.drop, Some(DropPolicy::Oldest));
    assert_eq!(gateway.project("demo").unwrap().root, PathBuf::from("/tmp/demo"));
    let [binding] = gateway.bindings.as_slice() else {
        panic!("one binding: {:?}", gateway.bindings)
    };
    assert_eq!(binding.transport, "telegram");
    assert_eq!(binding.chat_id.as_ref().and_then(|v| v.as_integer()), Some(123));
    assert_eq!(binding.project.as_deref(), Some("demo"));
    assert_eq!(binding.topic_id, None);
    assert_eq!(gateway.sms.as_ref().unwrap()["webhook_port"].as_integer(), Some(8786));
    let xmtp = gateway.xmtp.as_ref().unwrap();
    assert_eq!(xmtp["wallet_address"].as_str(), Some("0xabc"));
    assert_eq!(xmtp["poll_interval_ms"].as_integer(), Some(1500));
}

#[test]
fn explicit_false_is_honoured() {
    let config = check_ok(
        "[gateway]\nrequire_engine_lock = false\nauto_resume = false\nenable_webhook = false\n",
        // The router always resumes: the value is read, and the note says so.
        &["/home/u/.lemon/config.toml:3:1: gateway.auto_resume: false is accepted; a conversation here always continues its last engine session (send /new, or meta.disable_auto_resume = true, to start fresh)"],
    );
    assert!(!config.gateway.require_engine_lock);
    assert_eq!(config.gateway.auto_resume, Some(false));
    assert_eq!(config.gateway.enable_webhook, Some(false));
}

#[test]
fn zero_concurrent_runs_is_valid() {
    let config = check_ok("[gateway]\nmax_concurrent_runs = 0\n", &[]);
    assert_eq!(config.gateway.max_concurrent_runs, 0);
}

#[test]
fn wrong_type_names_file_line_column_and_key() {
    check_error(
        "[gateway]\n# how many runs at once\nmax_concurrent_runs = \"two\"\n",
        r#"/home/u/.lemon/config.toml:3:23: gateway.max_concurrent_runs: invalid type: string "two", expected a whole number, 0 or more"#,
    );
    check_error(
        "[gateway]\nrequire_engine_lock = \"no\"\n",
        r#"/home/u/.lemon/config.toml:2:23: gateway.require_engine_lock: invalid type: string "no", expected a boolean"#,
    );
    check_error(
        "[gateway.api]\nport = 70000\n",
        "/home/u/.lemon/config.toml:2:8: gateway.api.port: invalid value: integer `70000`, expected a whole number from 0 to 65535",
    );
    check_error(
        "[[gateway.bindings]]\ntransport = \"telegram\"\n\n[[gateway.bindings]]\ntransport = 5\n",
        "/home/u/.lemon/config.toml:5:13: gateway.bindings[1].transport: invalid type: integer `5`, expected a string",
    );
    check_error(
        "[gateway]\nbindings = [{ transport = \"telegram\", project = 7 }]\n",
        "/home/u/.lemon/config.toml:2:49: gateway.bindings[0].project: invalid type: integer `7`, expected a string",
    );
    check_error(
        "[gateway]\ntelegram = \"on\"\n",
        r#"/home/u/.lemon/config.toml:2:12: gateway.telegram: invalid type: string "on", expected a map"#,
    );
}

#[test]
fn a_scopes_approval_rule_that_is_not_a_glob_is_named_where_it_is() {
    check_error(
        "[[gateway.bindings]]\ntransport = \"telegram\"\napprovals = [{ tool = \"bash\", action = \"ask\" }, { tool = \"[x\", action = \"deny\" }]\n",
        "/home/u/.lemon/config.toml:3:58: gateway.bindings[0].approvals[1].tool: not a glob: unclosed character class; missing ']'",
    );
    check_error(
        "[gateway.projects.site]\nroot = \"/srv/site\"\napprovals = [{ tool = \"bash\", match = \"{a\", action = \"allow\" }]\n",
        "/home/u/.lemon/config.toml:3:39: gateway.projects.site.approvals[0].match: not a glob: unclosed alternate group; missing '}' (maybe escape '{' with '[{]'?)",
    );
    check_error(
        "[gateway.approvals.engines]\ncodex = [{ tool = \"[\", action = \"allow\" }]\n",
        "/home/u/.lemon/config.toml:2:19: gateway.approvals.engines.codex[0].tool: not a glob: unclosed character class; missing ']'",
    );
}

#[test]
fn a_retention_bound_of_zero_megabytes_is_named_where_it_is() {
    check_error(
        "[gateway.retention]\nmax_db_mb = 0\n",
        "/home/u/.lemon/config.toml:2:13: gateway.retention.max_db_mb: must be at least 1 (or unset: no bound)",
    );
}

#[test]
fn the_store_is_sqlite_unless_the_file_says_postgres_with_its_secret() {
    let gateway = check_ok("", &[]).gateway;
    assert_eq!(gateway.store, crate::config::StoreConfig::default());
    assert_eq!(gateway.store.backend.as_str(), "sqlite");
    assert_eq!(gateway.store.pool_size, 16);
    let text = "[gateway.store]\nbackend = \"postgres\"\nurl_secret = \"pg.url\"\npool_size = 4\n";
    let store = check_ok(text, &[]).gateway.store;
    assert_eq!(store.backend, crate::config::StoreBackendKind::Postgres);
    assert_eq!(store.url_secret.as_deref(), Some("pg.url"));
    assert_eq!(store.pool_size, 4);
}

#[test]
fn a_postgres_store_without_its_connection_secret_is_named_where_it_is() {
    check_error(
        "[gateway.store]\nbackend = \"postgres\"\n",
        "/home/u/.lemon/config.toml:2:11: gateway.store.backend: backend = \"postgres\" needs url_secret: the secret that holds the connection string",
    );
    check_error(
        "[gateway.store]\nbackend = \"postgres\"\nurl_secret = \"a b\"\n",
        "/home/u/.lemon/config.toml:3:14: gateway.store.url_secret: not a secret name (letters, digits, `_`, `-`, `.`; at most 128)",
    );
    check_error(
        "[gateway.store]\npool_size = 0\n",
        "/home/u/.lemon/config.toml:2:13: gateway.store.pool_size: must be from 1 to 1000",
    );
}

#[test]
fn cluster_mode_is_off_unless_the_file_turns_it_on_over_postgres() {
    let cluster = check_ok("", &[]).gateway.cluster;
    assert_eq!(cluster, crate::config::ClusterConfig::default());
    assert!(!cluster.enabled);
    assert_eq!(cluster.lease_term_ms, 10_000);
    assert_eq!(cluster.lease_term(), std::time::Duration::from_secs(10));
    let text = "[gateway.store]\nbackend = \"postgres\"\nurl_secret = \"pg.url\"\n\
                [gateway.cluster]\nenabled = true\nnode_id = \"node-a\"\nlease_term_ms = 3000\n\
                api_base_url = \"http://10.0.0.5:4040\"\n";
    let cluster = check_ok(text, &[]).gateway.cluster;
    assert!(cluster.enabled);
    assert_eq!(cluster.node().unwrap().as_str(), "node-a");
    assert_eq!(cluster.lease_term_ms, 3000);
    assert_eq!(cluster.api_base_url.as_deref(), Some("http://10.0.0.5:4040"));
    // No id: a new one at each start, never the same twice.
    let unnamed = crate::config::ClusterConfig { enabled: true, ..Default::default() };
    let (a, b) = (unnamed.node().unwrap(), unnamed.node().unwrap());
    assert!(a.as_str().starts_with("node-") && a != b, "{a} {b}");
    // A cluster section that is not enabled is accepted over SQLite.
    check_ok("[gateway.cluster]\nnode_id = \"node-a\"\n", &[]);
}

#[test]
fn a_cluster_over_sqlite_or_with_bad_keys_is_named_where_it_is() {
    check_error(
        "[gateway.cluster]\nenabled = true\n",
        "/home/u/.lemon/config.toml:2:11: gateway.cluster.enabled: cluster mode needs the postgres store ([gateway.store] backend = \"postgres\"); the store is sqlite",
    );
    check_error(
        "[gateway.cluster]\nnode_id = \"node a\"\n",
        "/home/u/.lemon/config.toml:2:11: gateway.cluster.node_id: invalid node id: only letters, digits, '.', '_' and '-' are allowed",
    );
    check_error(
        "[gateway.cluster]\nnode_id = \"\"\n",
        "/home/u/.lemon/config.toml:2:11: gateway.cluster.node_id: invalid node id: it must be 1 to 64 characters",
    );
    check_error(
        "[gateway.cluster]\nlease_term_ms = 999\n",
        "/home/u/.lemon/config.toml:2:17: gateway.cluster.lease_term_ms: must be from 1000 to 600000",
    );
    check_error(
        "[gateway.cluster]\nlease_term_ms = 600001\n",
        "/home/u/.lemon/config.toml:2:17: gateway.cluster.lease_term_ms: must be from 1000 to 600000",
    );
    check_error(
        "[gateway.cluster]\napi_base_url = \"10.0.0.5:4040\"\n",
        "/home/u/.lemon/config.toml:2:16: gateway.cluster.api_base_url: \"10.0.0.5:4040\" is not an http:// or https:// URL",
    );
    check_error(
        "[gateway.cluster]\napi_base_url = \"https://\"\n",
        "/home/u/.lemon/config.toml:2:16: gateway.cluster.api_base_url: \"https://\" is not an http:// or https:// URL",
    );
    // Unknown keys are warned about like everywhere else.
    check_ok(
        "[gateway.cluster]\nnode = \"a\"\n",
        &["/home/u/.lemon/config.toml:2:1: unknown key gateway.cluster.node (ignored)"],
    );
}

#[test]
fn a_backup_schedule_that_does_not_parse_is_named_where_it_is() {
    check_error(
        "[gateway.backup]\nevery = \"daily at 25pm\"\n",
        "/home/u/.lemon/config.toml:2:9: gateway.backup.every: `25pm` is not a time of day (such as 9am, 9:30pm, 21:15)",
    );
    check_error(
        "[gateway.backup]\nevery = \"@daily\"\nkeep = 0\n",
        "/home/u/.lemon/config.toml:3:8: gateway.backup.keep: must be at least 1",
    );
}

#[test]
fn missing_required_key_names_the_table() {
    check_error(
        "[gateway.projects.demo]\ndefault_engine = \"claude\"\n",
        "/home/u/.lemon/config.toml:1:1: gateway.projects.demo: missing field `root`",
    );
    check_error(
        "[[gateway.bindings]]\nchat_id = 1\n",
        "/home/u/.lemon/config.toml:1:1: gateway.bindings[0]: missing field `transport`",
    );
}

#[test]
fn unknown_queue_modes_list_the_valid_ones() {
    check_error(
        "[gateway.queue]\nmode = \"fifo\"\n",
        "/home/u/.lemon/config.toml:2:8: gateway.queue.mode: unknown variant `fifo`, expected one of \
         `collect`, `followup`, `steer`, `steer_backlog`, `redirect`, `interrupt`",
    );
    check_error(
        "[gateway.queue]\ndrop = \"reject\"\n",
        "/home/u/.lemon/config.toml:2:8: gateway.queue.drop: unknown variant `reject`, expected `oldest` or `newest`",
    );
    check_error(
        "[[gateway.bindings]]\ntransport = \"telegram\"\nqueue_mode = \"lifo\"\n",
        "/home/u/.lemon/config.toml:3:14: gateway.bindings[0].queue_mode: unknown variant `lifo`, expected one of \
         `collect`, `followup`, `steer`, `steer_backlog`, `redirect`, `interrupt`",
    );
}

#[test]
fn queue_mode_spellings_round_trip() {
    for mode in QueueMode::ALL {
        let config = check_ok(&format!("[gateway.queue]\nmode = \"{}\"\n", mode.as_str()), &[]);
        assert_eq!(config.gateway.queue.mode, Some(mode));
    }
    for drop in DropPolicy::ALL {
        let config = check_ok(&format!("[gateway.queue]\ndrop = \"{}\"\n", drop.as_str()), &[]);
        assert_eq!(config.gateway.queue.drop, Some(drop));
    }
}

#[test]
fn syntax_errors_have_line_and_column() {
    check_error(
        "[gateway]\nmax_concurrent_runs = \n",
        "/home/u/.lemon/config.toml:2:23: invalid TOML: invalid string; expected `\"`, `'`",
    );
    check_error(
        "[gateway\n",
        "/home/u/.lemon/config.toml:1:9: invalid TOML: invalid table header; expected `.`, `]`",
    );
    check_error(
        "[gateway]\nshutdown_grace_ms = 1\nshutdown_grace_ms = 2\n",
        "/home/u/.lemon/config.toml:3:1: invalid TOML: duplicate key `shutdown_grace_ms` in table `gateway`",
    );
}

#[test]
fn unknown_keys_are_warnings_with_their_dotted_path() {
    let config = check_ok(
        "[gateway]\nmax_concurent_runs = 3\n\n[gateway.queue]\nmode = \"collect\"\nsize = 4\n",
        &[
            // With the closest known key where one is close (new with the suggestions).
            "/home/u/.lemon/config.toml:2:1: unknown key gateway.max_concurent_runs (ignored); did you mean `max_concurrent_runs`?",
            "/home/u/.lemon/config.toml:6:1: unknown key gateway.queue.size (ignored)",
        ],
    );
    assert_eq!(config.gateway.max_concurrent_runs, 2);
    assert_eq!(config.gateway.queue.mode, Some(QueueMode::Collect));

    check_ok(
        "agent = \"x\"\n\n[[gateway.bindings]]\ntransport = \"telegram\"\nchat = 1\n\n\
         [gateway.projects.demo]\nroot = \"/tmp\"\n\"odd key\" = 1\n",
        &[
            "/home/u/.lemon/config.toml:1:1: unknown key agent (ignored)",
            "/home/u/.lemon/config.toml:5:1: unknown key gateway.bindings[0].chat (ignored); did you mean `chat_id`?",
            "/home/u/.lemon/config.toml:9:1: unknown key gateway.projects.demo.\"odd key\" (ignored)",
        ],
    );
    check_ok(
        "gateway.api = { bind = \"::1\", prot = 1 }\n",
        &["/home/u/.lemon/config.toml:1:31: unknown key gateway.api.prot (ignored); did you mean `port`?"],
    );
}

#[test]
fn engine_and_channel_specific_keys_are_not_unknown() {
    let config = check_ok(
        "[gateway.engines.pi]\nthinking = \"high\"\n\n[gateway.telegram]\nanything = 1\n\n\
         [gateway.dashboard]\ntheme = \"dark\"\n",
        &[],
    );
    assert_eq!(config.gateway.engine("pi").unwrap()["thinking"].as_str(), Some("high"));
}

#[test]
fn engine_ids_are_checked() {
    check_error(
        "[gateway.engines.Bad]\ndelay_ms = 1\n",
        r#"/home/u/.lemon/config.toml:1:18: gateway.engines.Bad: invalid engine id "Bad": must match ^[a-z][a-z0-9_-]*$"#,
    );
    check_error(
        "[gateway.engines.default]\n",
        r#"/home/u/.lemon/config.toml:1:18: gateway.engines.default: engine id "default" is reserved"#,
    );
    check_error(
        "[gateway]\ndefault_engine = \"Claude\"\n",
        r#"/home/u/.lemon/config.toml:2:18: gateway.default_engine: invalid engine id "Claude": must match ^[a-z][a-z0-9_-]*$"#,
    );
    check_error(
        "[gateway]\ndefault_engine = \"claude:\"\n",
        r#"/home/u/.lemon/config.toml:2:18: gateway.default_engine: engine "claude:" has an empty model after `:`"#,
    );
    check_error(
        "[gateway.projects.demo]\nroot = \"/tmp\"\ndefault_engine = \"help\"\n",
        r#"/home/u/.lemon/config.toml:3:18: gateway.projects.demo.default_engine: engine id "help" is reserved"#,
    );
    check_error(
        "[[gateway.bindings]]\ntransport = \"telegram\"\ndefault_engine = \"9lives:x\"\n",
        r#"/home/u/.lemon/config.toml:3:18: gateway.bindings[0].default_engine: invalid engine id "9lives": must match ^[a-z][a-z0-9_-]*$"#,
    );
    let config = check_ok("[gateway]\ndefault_engine = \"claude:opus\"\n", &[]);
    assert_eq!(config.gateway.default_engine.as_ref().unwrap(), "claude:opus");
}

#[test]
fn models_that_could_reach_a_command_line_as_an_option_are_config_errors() {
    let rule = "use up to 128 ASCII letters, digits and `._:/@-`, not starting with `-`";
    check_error(
        "[gateway]\ndefault_engine = \"claude:--dangerously-skip-permissions\"\n",
        &format!("{FILE}:2:18: gateway.default_engine: invalid model: it starts with '-'; {rule}"),
    );
    check_error(
        "[gateway.projects.demo]\nroot = \"/tmp\"\ndefault_engine = \"codex:gpt 5\"\n",
        &format!(
            "{FILE}:3:18: gateway.projects.demo.default_engine: invalid model: it contains a character that is not allowed; {rule}"
        ),
    );
    check_error(
        "[[gateway.bindings]]\ntransport = \"telegram\"\ndefault_engine = \"claude:--allowedTools=Bash\"\n",
        &format!(
            "{FILE}:3:18: gateway.bindings[0].default_engine: invalid model: it starts with '-'; {rule}"
        ),
    );
    let config = check_ok(
        "[gateway]\ndefault_engine = \"pi:anthropic/claude-sonnet-4-5\"\n[gateway.engines.claude]\nmodel = \"claude-opus-4-1@20250805\"\n",
        &[],
    );
    assert_eq!(config.gateway.default_engine.as_ref().unwrap(), "pi:anthropic/claude-sonnet-4-5");
}

#[test]
fn values_are_validated() {
    check_error(
        "[gateway.queue]\ncap = 0\n",
        "/home/u/.lemon/config.toml:2:7: gateway.queue.cap: must be at least 1",
    );
    check_error(
        "[[gateway.bindings]]\ntransport = \" \"\n",
        "/home/u/.lemon/config.toml:2:13: gateway.bindings[0].transport: must not be empty",
    );
    check_error(
        "[gateway.projects.demo]\nroot = \"\"\n",
        "/home/u/.lemon/config.toml:2:8: gateway.projects.demo.root: must not be empty",
    );
    check_error(
        "[gateway.queue]\ncap = -1\n",
        "/home/u/.lemon/config.toml:2:7: gateway.queue.cap: invalid value: integer `-1`, expected a whole number, 0 or more",
    );
}

#[test]
fn http_limits_have_defaults_and_refuse_zero() {
    let config = check_ok("", &[]);
    assert_eq!(config.gateway.http_header_read_timeout_ms, 10_000);
    assert_eq!(config.gateway.http_idle_timeout_ms, 5_000);
    assert_eq!(config.gateway.http_max_connections, None);
    let config = check_ok(
        "[gateway]\nhttp_header_read_timeout_ms = 500\nhttp_idle_timeout_ms = 250\nhttp_max_connections = 64\n",
        &[],
    );
    assert_eq!(config.gateway.http_header_read_timeout_ms, 500);
    assert_eq!(config.gateway.http_idle_timeout_ms, 250);
    assert_eq!(config.gateway.http_max_connections, Some(64));
    check_error(
        "[gateway]\nhttp_idle_timeout_ms = 0\n",
        "/home/u/.lemon/config.toml:2:24: gateway.http_idle_timeout_ms: must be at least 1",
    );
    check_error(
        "[gateway]\nhttp_max_connections = 0\n",
        "/home/u/.lemon/config.toml:2:24: gateway.http_max_connections: must be at least 1",
    );
}

#[test]
fn worker_threads_default_to_one_less_than_the_cpus() {
    let config = check_ok("", &[]).gateway;
    assert_eq!(config.worker_threads, None);
    assert_eq!(config.worker_threads_for(1), 1);
    assert_eq!(config.worker_threads_for(2), 1);
    assert_eq!(config.worker_threads_for(8), 7);
    let config = check_ok("[gateway]\nworker_threads = 4\n", &[]).gateway;
    assert_eq!((config.worker_threads_for(2), config.worker_threads_for(16)), (4, 4));
    check_error(
        "[gateway]\nworker_threads = 0\n",
        "/home/u/.lemon/config.toml:2:18: gateway.worker_threads: must be at least 1",
    );
    check_error(
        "[gateway]\nworker_threads = 5000\n",
        "/home/u/.lemon/config.toml:2:18: gateway.worker_threads: 5000 is too large: must be at most 1024",
    );
}

#[test]
fn client_limits_have_defaults_and_say_which_value_is_wrong() {
    let limits = check_ok("", &[]).gateway.http_client_limits;
    assert_eq!(
        (limits.max_connections, limits.requests_per_second, limits.burst()),
        (256, 50, 200)
    );
    assert_eq!(limits.exempt, ["127.0.0.0/8", "::1"]);
    let limits = check_ok(
        "[gateway.http_client_limits]\nmax_connections = 0\nrequests_per_second = 5\nburst = 7\nexempt = []\n",
        &[],
    )
    .gateway
    .http_client_limits;
    assert_eq!((limits.max_connections, limits.requests_per_second, limits.burst()), (0, 5, 7));
    assert!(limits.exempt.is_empty());
    check_ok(
        "[gateway.http_client_limits]\nburstt = 3\n",
        &["/home/u/.lemon/config.toml:2:1: unknown key gateway.http_client_limits.burstt (ignored); did you mean `burst`?"],
    );
    check_error(
        "[gateway.http_client_limits]\nexempt = [\"10.0.0.0/8\", \"lan\"]\n",
        "/home/u/.lemon/config.toml:2:25: gateway.http_client_limits.exempt[1]: \"lan\" is not an IP address or a CIDR block like 10.0.0.0/8",
    );
    check_error(
        "[gateway.http_client_limits]\nexempt = [\"10.0.0.0/40\"]\n",
        "/home/u/.lemon/config.toml:2:11: gateway.http_client_limits.exempt[0]: \"10.0.0.0/40\": the prefix must be a number from 0 to 32",
    );
    check_error(
        "[gateway.http_client_limits]\nburst = 0\n",
        "/home/u/.lemon/config.toml:2:9: gateway.http_client_limits.burst: must be at least 1 while requests_per_second is set",
    );
    check_error(
        "[gateway.http_client_limits]\nrequests_per_second = 2000000\n",
        "/home/u/.lemon/config.toml:2:23: gateway.http_client_limits.requests_per_second: must be at most 1000000",
    );
}

#[test]
fn load_file_or_default_treats_a_missing_file_as_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = load_file_or_default(&dir.path().join("config.toml")).unwrap();
    assert!(loaded.warnings.is_empty());
    assert_eq!(loaded.config.gateway.max_concurrent_runs, 2);

    let missing = dir.path().join("config.toml");
    let err = load_file(&missing).unwrap_err();
    assert_eq!(err.path(), missing);
    assert!(
        err.to_string().starts_with(&format!("{}: cannot read config file: ", missing.display())),
        "{err}"
    );
}

#[test]
fn a_section_nobody_reads_is_an_error_where_it_is() {
    check_error(
        "[gatway]\nmax_concurrent_runs = 3\n",
        "/home/u/.lemon/config.toml:1:2: gatway: unknown section; did you mean `gateway`?",
    );
    check_error(
        "[gateway]\nmax_concurrent_runs = 3\n\n[gateway.telegrm]\nbot_token = \"x\"\n",
        "/home/u/.lemon/config.toml:4:10: gateway.telegrm: unknown section; did you mean `telegram`?",
    );
    check_error(
        "[agent]\nname = \"x\"\n",
        "/home/u/.lemon/config.toml:1:2: agent: unknown section",
    );
}

#[test]
fn load_file_reads_and_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, "[gateway]\nmax_concurrent_runs = 5\nbogus = 1\n").unwrap();
    let loaded = load_file(&path).unwrap();
    assert_eq!(loaded.config.gateway.max_concurrent_runs, 5);
    assert_eq!(
        loaded.warnings,
        [format!("{}:3:1: unknown key gateway.bogus (ignored)", path.display())]
    );
    assert_eq!(load_file_or_default(&path).unwrap().config.gateway.max_concurrent_runs, 5);

    std::fs::write(&path, "[gateway]\nmax_concurrent_runs = true\n").unwrap();
    let err = load_file(&path).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}:2:23: gateway.max_concurrent_runs: invalid type: boolean `true`, expected a whole number, 0 or more",
            path.display()
        )
    );
    assert_eq!(err.position(), Some(Position { line: 2, column: 23 }));
}

#[test]
fn unreadable_path_is_an_error_naming_it() {
    // A directory cannot be read as a file, even by root.
    let dir = tempfile::tempdir().unwrap();
    for result in [load_file(dir.path()), load_file_or_default(dir.path())] {
        let err = result.unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
        assert!(
            err.to_string()
                .starts_with(&format!("{}: cannot read config file: ", dir.path().display())),
            "{err}"
        );
    }
}

#[test]
fn positions_count_characters_from_one() {
    let check = |text: &str, offset: usize, line: usize, column: usize| {
        assert_eq!(
            Position::of_offset(text, offset),
            Position { line, column },
            "{text:?} @ {offset}"
        );
    };
    check("", 0, 1, 1);
    check("ab\ncd", 4, 2, 2);
    check("é = 1", 2, 1, 2);
    check("ab", 99, 1, 3);
}

#[test]
fn errors_in_sections_other_crates_parse_point_at_the_key() {
    let text = "[gateway]\nenable_telegram = true\n\n[gateway.telegram]\nbot_token = \"1:a\"\npoll_timeout = 3\npoll_timeout_s = \"x\"\n";
    let path = std::path::Path::new("/etc/lemon/config.toml");
    let section = ["gateway", "telegram"];
    let unknown = super::section_error(
        path,
        text,
        &section,
        "unknown field `poll_timeout`, expected one of `bot_token`, `poll_timeout_s`",
    );
    assert_eq!(
        unknown.to_string(),
        "/etc/lemon/config.toml:6:1: gateway.telegram.poll_timeout: unknown field `poll_timeout`, expected one of `bot_token`, `poll_timeout_s`"
    );
    let wrong = super::section_error(
        path,
        text,
        &section,
        "invalid type: string \"x\", expected u64 in `poll_timeout_s`",
    );
    assert_eq!(wrong.position(), Some(super::Position { line: 7, column: 18 }));
    let general = super::section_error(path, text, &section, "set bot_token or bot_token_secret");
    assert_eq!(general.position(), Some(super::Position { line: 4, column: 1 }));
    assert!(general.to_string().contains(": gateway.telegram: set bot_token"), "{general}");
}

#[test]
fn cwd_allowed_resolves_symlinks_before_checking_the_roots() {
    let root = tempfile::tempdir().unwrap();
    let inside = root.path().join("project");
    std::fs::create_dir(&inside).unwrap();
    std::os::unix::fs::symlink("/", inside.join("out")).unwrap();
    let roots = vec![root.path().to_owned()];
    assert!(crate::config::cwd_allowed(&[], Path::new("/")), "no roots: anything");
    assert!(crate::config::cwd_allowed(&roots, &inside));
    assert!(crate::config::cwd_allowed(&roots, &inside.join("..").join("project")));
    assert!(!crate::config::cwd_allowed(&roots, &inside.join("out")), "a link out of the root");
    assert!(!crate::config::cwd_allowed(&roots, Path::new("/")));
    assert!(!crate::config::cwd_allowed(&roots, &inside.join("missing")));
}

#[test]
fn allowed_cwd_roots_must_be_absolute() {
    let err =
        load_str("[gateway]\nallowed_cwd_roots = [\"/srv\", \"projects\"]\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
    assert!(err.starts_with("c.toml:2:"), "{err}");
    assert!(err.contains("projects is not an absolute path"), "{err}");
}

#[test]
fn counts_and_durations_have_upper_bounds() {
    check_error(
        "[gateway]\nmax_concurrent_runs = 99999999999999\n",
        "/home/u/.lemon/config.toml:2:23: gateway.max_concurrent_runs: 99999999999999 is too large: must be at most 4096",
    );
    check_error(
        "[gateway]\nmax_pending_runs = 99999999999999\n",
        "/home/u/.lemon/config.toml:2:20: gateway.max_pending_runs: 99999999999999 is too large: must be at most 100000000",
    );
    check_error(
        "[gateway.queue]\ncap = 99999999999999\n",
        "/home/u/.lemon/config.toml:2:7: gateway.queue.cap: 99999999999999 is too large: must be at most 1000000",
    );
    check_error(
        "[gateway]\nrun_inactivity_timeout_ms = 99999999999999\n",
        "/home/u/.lemon/config.toml:2:29: gateway.run_inactivity_timeout_ms: 99999999999999 is too large: must be at most 2592000000",
    );
    let config =
        check_ok("[gateway]\nmax_concurrent_runs = 4096\nshutdown_grace_ms = 2592000000\n", &[]);
    assert_eq!(config.gateway.max_concurrent_runs, 4096);
}

#[test]
fn the_workspace_is_under_lemon_home_unless_configured_elsewhere() {
    let home = Path::new("/srv/lemon");
    let user = Path::new("/home/me");
    let load = |text: &str| load_str(text, Path::new("c.toml")).unwrap().config.gateway;
    let unset = load("");
    assert_eq!(unset.workspace(home, Some(user)), Path::new("/srv/lemon/workspace"));
    assert!(!unset.auto_send_generated_images);
    let tilde = load("[gateway]\nworkspace_dir = \"~/ws\"\nauto_send_generated_images = true\n");
    assert_eq!(tilde.workspace(home, Some(user)), Path::new("/home/me/ws"));
    assert!(tilde.auto_send_generated_images);
    let relative = load("[gateway]\nworkspace_dir = \"files\"\n");
    assert_eq!(relative.workspace(home, None), Path::new("/srv/lemon/files"));
    let absolute = load("[gateway]\nworkspace_dir = \"/data/ws\"\n");
    assert_eq!(absolute.workspace(home, Some(user)), Path::new("/data/ws"));
}

#[test]
fn cron_jobs_are_read_with_their_defaults() {
    let config = check_ok(
        "[[gateway.cron]]\nname = \"digest\"\nschedule = \"daily at 9am\"\nprompt = \"summarise\"\n\
         session_key = \"agent:ops:telegram:1:dm:2\"\ntimezone = \"Europe/Berlin\"\njitter_sec = 30\n\n\
         [[gateway.cron]]\nname = \"ping\"\nschedule = \"*/5 * * * *\"\nprompt = \"ping\"\n",
        &[],
    );
    let jobs = &config.gateway.cron;
    assert_eq!(jobs.len(), 2);
    let digest = jobs[0].to_spec();
    assert_eq!(digest.name.as_deref(), Some("digest"));
    assert_eq!(digest.session_key.as_str(), "agent:ops:telegram:1:dm:2");
    assert_eq!(digest.timezone.as_deref(), Some("Europe/Berlin"));
    assert_eq!(digest.jitter_sec, Some(30));
    assert_eq!(digest.timeout_ms, None);
    assert_eq!(jobs[1].to_spec().session_key.as_str(), "agent:default:main");
}

#[test]
fn bad_cron_jobs_are_config_errors_at_their_value() {
    check_error(
        "[[gateway.cron]]\nname = \"x\"\nschedule = \"every 90m\"\nprompt = \"p\"\n",
        "/home/u/.lemon/config.toml:3:12: gateway.cron[0].schedule: invalid schedule \"every 90m\": `every 90m`: minutes must be 1 to 59 (use hours for longer)",
    );
    check_error(
        "[[gateway.cron]]\nname = \"x\"\nschedule = \"61 * * * *\"\nprompt = \"p\"\n",
        "/home/u/.lemon/config.toml:3:12: gateway.cron[0].schedule: invalid schedule \"61 * * * *\": minute field `61`: 61 is out of range 0-59",
    );
    check_error(
        "[[gateway.cron]]\nname = \"x\"\nschedule = \"@daily\"\nprompt = \"p\"\ntimezone = \"Mars/Base\"\n",
        "/home/u/.lemon/config.toml:5:12: gateway.cron[0].timezone: unknown time zone `Mars/Base` (use an IANA name such as Europe/Berlin or UTC)",
    );
    check_error(
        "[[gateway.cron]]\nname = \"x\"\nschedule = \"@daily\"\nprompt = \"p\"\n\n\
         [[gateway.cron]]\nname = \"x\"\nschedule = \"@daily\"\nprompt = \"q\"\n",
        "/home/u/.lemon/config.toml:7:8: gateway.cron[1].name: another job is already named \"x\"",
    );
    check_error(
        "[[gateway.cron]]\nname = \"x\"\nschedule = \"@daily\"\nprompt = \"  \"\n",
        "/home/u/.lemon/config.toml:4:10: gateway.cron[0].prompt: must not be empty",
    );
    check_error(
        "[[gateway.cron]]\nname = \"x\"\nschedule = \"@daily\"\nprompt = \"p\"\nsession_key = \"a\\nb\"\n",
        "/home/u/.lemon/config.toml:5:15: gateway.cron[0].session_key: invalid session_key: control characters are not allowed",
    );
    check_error(
        "[[gateway.cron]]\nname = \"x\"\nschedule = \"@daily\"\nprompt = \"p\"\ntimeout_ms = 0\n",
        "/home/u/.lemon/config.toml:5:14: gateway.cron[0].timeout_ms: must be 1 to 2592000000",
    );
    check_error(
        "[[gateway.cron]]\nname = \"x\"\nprompt = \"p\"\n",
        "/home/u/.lemon/config.toml:1:1: gateway.cron[0]: missing field `schedule`",
    );
}
