//! Tests of a run's link to the gateway's MCP endpoint: which CLI is pointed
//! there and how, where its token goes (never on the command line), and
//! that the file holding it and the token itself end with the link.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use lemon_core::approvals::{ApprovalHub, Gate, Rules, RunScope};
use lemon_core::config::ApprovalsConfig;
use lemon_core::engine::{EventSink, StartRequest};
use serde_json::Value;

use super::*;
use crate::cli::{claude, codex, droid, opencode, CommandInput, Invocation};
use crate::config::EngineSection;

const URL: &str = "http://127.0.0.1:4041/mcp";

/// A gate whose endpoint listens at [`URL`]; `refusing`: the default rules
/// (a rule may say no), else `rules = []` (every call runs).
fn listening_gate(refusing: bool) -> Gate {
    let config = ApprovalsConfig {
        rules: if refusing { None } else { Some(Vec::new()) },
        ..ApprovalsConfig::default()
    };
    let gate = Gate::new(Rules::from_config(&config).unwrap(), ApprovalHub::default());
    gate.set_url(URL.to_owned());
    gate
}

fn request() -> StartRequest {
    StartRequest {
        run_id: lemon_core::ids::RunId::generate(),
        session_key: "agent:main:telegram:group:-100123".into(),
        prompt: "hi".to_owned(),
        resume: None,
        cwd: PathBuf::from("/work"),
        model: None,
        meta: BTreeMap::new(),
        workspace: None,
        off_limits: lemon_core::contain::OffLimits::none(),
        attachments: Vec::new(),
    }
}

/// `[gateway.engines.<vendor>]` as `text` says.
fn settings(vendor: Vendor, text: &str) -> CliSettings {
    let table: toml::Table = toml::from_str(text).unwrap();
    CliSettings::from_section(vendor, &EngineSection::parse(&table).unwrap())
}

/// The link a run of `vendor` opens on `gate` with `settings`.
fn open(gate: &Gate, vendor: Vendor, settings: &CliSettings) -> Option<GateLink> {
    let req = request();
    let (sink, _events) = EventSink::channel(8);
    let scope = RunScope { untrusted: false, engine: vendor.id(), cwd: &req.cwd, meta: &req.meta };
    GateLink::open(gate, vendor, settings, &scope, &req, &sink).unwrap()
}

/// The command line and the environment the run's CLI gets.
fn launched(
    vendor: Vendor,
    settings: &CliSettings,
    link: Option<&GateLink>,
) -> (Invocation, BTreeMap<String, String>) {
    let base = BTreeMap::new();
    let input = CommandInput {
        settings,
        prompt: "p",
        resume: None,
        model: None,
        cwd: std::path::Path::new("/work"),
        base_env: &base,
        max_budget_usd: None,
        gateway_mcp: link.and_then(GateLink::access),
    };
    let invocation = match vendor {
        Vendor::Claude => claude::command(&input),
        Vendor::Codex if link.is_some_and(GateLink::relayed) => codex::app_server::command(&input),
        Vendor::Codex => codex::command(&input),
        Vendor::Opencode => opencode::command(&input),
        Vendor::Droid => droid::command(&input),
        Vendor::Pi => crate::cli::pi::command(&input),
    };
    let mut env = crate::cli::settings::child_env(&base, &invocation.env, settings, None);
    if let Some(access) = link.and_then(GateLink::access) {
        access.add_env(&mut env);
    }
    (invocation, env)
}

fn token_of(link: &GateLink) -> String {
    link.registration.token.clone()
}

fn has(args: &[String], flag: &str) -> bool {
    args.iter().any(|arg| arg == flag)
}

/// The value after `flag`.
fn after<'a>(args: &'a [String], flag: &str) -> &'a str {
    let at =
        args.iter().position(|arg| arg == flag).unwrap_or_else(|| panic!("{flag} in {args:?}"));
    &args[at + 1]
}

/// The file's JSON; asserts only its owner may read it.
fn secret_json(path: &str) -> Value {
    let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{path}");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn bearer(token: &str) -> Value {
    Value::String(format!("Bearer {token}"))
}

#[test]
fn claude_gets_one_config_file_for_its_permission_prompts_and_the_gateways_tools() {
    let gate = listening_gate(true);
    let settings = settings(Vendor::Claude, "");
    let link = open(&gate, Vendor::Claude, &settings).expect("a link");
    let token = token_of(&link);
    let (invocation, env) = launched(Vendor::Claude, &settings, Some(&link));
    let args = &invocation.args;
    assert_eq!(after(args, "--permission-prompt-tool"), "mcp__lemon__approve");
    let file = after(args, "--mcp-config").to_owned();
    let config = secret_json(&file);
    let server = &config["mcpServers"]["lemon"];
    assert_eq!(server["type"], "http");
    assert_eq!(server["url"], URL);
    assert_eq!(server["headers"]["Authorization"], bearer(&token));
    assert!(!args.iter().any(|arg| arg.contains(&token)), "{args:?}");
    assert!(!file.contains(&token[..8]), "the file's name owes nothing to the token");
    assert!(!env.values().any(|value| value.contains(&token)));
    // The token names the run's session, and opens the gateway's tools.
    let run = gate.run_of(&token).expect("registered");
    assert_eq!(run.session_key, "agent:main:telegram:group:-100123");
    assert!(lemon_core::mcp::ToolFilter::from_meta(&run.meta).is_all());
    assert!(!format!("{link:?}").contains(&token));

    drop(link);
    assert!(!std::path::Path::new(&file).exists(), "the file goes with the run");
    assert!(!gate.knows(&token), "the token goes with the run");
}

#[test]
fn claude_skipping_permissions_still_gets_the_gateways_tools() {
    let gate = listening_gate(true);
    let settings = settings(Vendor::Claude, "dangerously_skip_permissions = true");
    let link = open(&gate, Vendor::Claude, &settings).expect("a link for the tools");
    let (invocation, _) = launched(Vendor::Claude, &settings, Some(&link));
    let args = &invocation.args;
    assert!(has(args, "--dangerously-skip-permissions"), "{args:?}");
    assert!(!has(args, "--permission-prompt-tool"), "{args:?}");
    let config = secret_json(after(args, "--mcp-config"));
    assert_eq!(config["mcpServers"]["lemon"]["headers"]["Authorization"], bearer(&token_of(&link)));
}

#[test]
fn without_gateway_tools_only_the_relays_remain() {
    let gate = listening_gate(true);
    // Claude still asks through `approve`, and its token opens nothing else.
    let claude_settings = settings(Vendor::Claude, "gateway_tools = false");
    let link = open(&gate, Vendor::Claude, &claude_settings).expect("the permission relay");
    let (invocation, _) = launched(Vendor::Claude, &claude_settings, Some(&link));
    assert!(has(&invocation.args, "--permission-prompt-tool"));
    let filter =
        lemon_core::mcp::ToolFilter::from_meta(&gate.run_of(&token_of(&link)).unwrap().meta);
    assert!(filter.allows("approve") && !filter.allows("cron"), "{filter:?}");
    let skipping =
        settings(Vendor::Claude, "gateway_tools = false\ndangerously_skip_permissions = true");
    assert!(open(&gate, Vendor::Claude, &skipping).is_none());

    // Codex relays in-process and is given no endpoint.
    let codex_settings = settings(Vendor::Codex, "gateway_tools = false");
    let link = open(&gate, Vendor::Codex, &codex_settings).expect("the codex relay");
    assert!(link.relayed() && link.access().is_none());
    let (invocation, env) = launched(Vendor::Codex, &codex_settings, Some(&link));
    assert!(!invocation.args.iter().any(|arg| arg.contains("mcp_servers")));
    assert!(!env.contains_key(TOKEN_ENV));
    assert!(open(&listening_gate(false), Vendor::Codex, &codex_settings).is_none());

    for vendor in [Vendor::Opencode, Vendor::Droid, Vendor::Pi] {
        assert!(open(&listening_gate(false), vendor, &settings(vendor, "gateway_tools = false"))
            .is_none());
    }
}

#[test]
fn codex_gets_the_endpoint_in_overrides_and_the_token_in_its_bearer_variable() {
    for refusing in [false, true] {
        let gate = listening_gate(refusing);
        let settings = settings(Vendor::Codex, "");
        let link = open(&gate, Vendor::Codex, &settings).expect("a link");
        assert_eq!(link.relayed(), refusing);
        let token = token_of(&link);
        let (invocation, env) = launched(Vendor::Codex, &settings, Some(&link));
        let args = &invocation.args;
        assert_eq!(args[0], if refusing { "app-server" } else { "exec" }, "{args:?}");
        for pair in [
            ["-c", "mcp_servers.lemon.url=\"http://127.0.0.1:4041/mcp\""],
            ["-c", "mcp_servers.lemon.bearer_token_env_var=\"LEMON_MCP_TOKEN\""],
            ["-c", "mcp_servers.lemon.default_tools_approval_mode=\"approve\""],
            ["-c", "mcp_servers.lemon.tool_timeout_sec=3600.0"],
        ] {
            assert!(args.windows(2).any(|window| window == pair), "{pair:?} in {args:?}");
        }
        assert!(!args.iter().any(|arg| arg.contains(&token)), "{args:?}");
        assert_eq!(env.get(TOKEN_ENV), Some(&token));
    }
}

#[test]
fn opencode_gets_the_endpoint_in_its_config_variable_merged_into_the_sections() {
    let gate = listening_gate(false);
    let settings = settings(Vendor::Opencode, "");
    let link = open(&gate, Vendor::Opencode, &settings).expect("a link");
    let token = token_of(&link);
    let (invocation, env) = launched(Vendor::Opencode, &settings, Some(&link));
    assert!(!invocation.args.iter().any(|arg| arg.contains(&token)));
    let config: Value = serde_json::from_str(&env[OPENCODE_CONFIG_ENV]).unwrap();
    let server = &config["mcp"]["lemon"];
    assert_eq!(server["type"], "remote");
    assert_eq!(server["url"], URL);
    assert_eq!(server["headers"]["Authorization"], bearer(&token));
    assert_eq!(server["oauth"], false);

    let own = r#"env = { OPENCODE_CONFIG_CONTENT = '{"model":"a/b","mcp":{"docs":{"type":"remote","url":"https://d"}}}' }"#;
    let settings = self::settings(Vendor::Opencode, own);
    let link = open(&gate, Vendor::Opencode, &settings).expect("a link");
    let (_, env) = launched(Vendor::Opencode, &settings, Some(&link));
    let config: Value = serde_json::from_str(&env[OPENCODE_CONFIG_ENV]).unwrap();
    assert_eq!(config["model"], "a/b");
    assert_eq!(config["mcp"]["docs"]["url"], "https://d");
    assert_eq!(config["mcp"]["lemon"]["headers"]["Authorization"], bearer(&token_of(&link)));

    let settings = self::settings(Vendor::Opencode, "env = { OPENCODE_CONFIG_CONTENT = '// x' }");
    let link = open(&gate, Vendor::Opencode, &settings).expect("a link");
    let (_, env) = launched(Vendor::Opencode, &settings, Some(&link));
    assert_eq!(env[OPENCODE_CONFIG_ENV], "// x", "one the gateway cannot read is left alone");
}

#[test]
fn droid_gets_a_runtime_settings_file_and_pi_nothing() {
    let gate = listening_gate(false);
    let settings = settings(Vendor::Droid, "");
    let link = open(&gate, Vendor::Droid, &settings).expect("a link");
    let token = token_of(&link);
    let (invocation, env) = launched(Vendor::Droid, &settings, Some(&link));
    let args = &invocation.args;
    let file = after(args, "--settings").to_owned();
    let config = secret_json(&file);
    let server = &config["mcp"]["mcpServers"]["lemon"];
    assert_eq!((server["type"].as_str(), server["url"].as_str()), (Some("http"), Some(URL)));
    assert_eq!(server["headers"]["Authorization"], bearer(&token));
    assert!(!args.iter().any(|arg| arg.contains(&token)));
    assert!(!env.values().any(|value| value.contains(&token)));
    assert_eq!(args.last().map(String::as_str), Some("p"), "the prompt stays last");
    drop(link);
    assert!(!std::path::Path::new(&file).exists());

    assert!(open(&gate, Vendor::Pi, &self::settings(Vendor::Pi, "")).is_none());
}

#[test]
fn no_cli_is_pointed_at_an_endpoint_that_does_not_listen() {
    let config = ApprovalsConfig::default();
    let gate = Gate::new(Rules::from_config(&config).unwrap(), ApprovalHub::default());
    for vendor in [Vendor::Claude, Vendor::Droid, Vendor::Pi] {
        assert!(open(&gate, vendor, &settings(vendor, "")).is_none(), "{vendor}");
    }
    // Codex still relays its approvals in-process.
    let link = open(&gate, Vendor::Codex, &settings(Vendor::Codex, "")).expect("the relay");
    assert!(link.relayed() && link.access().is_none());
}
