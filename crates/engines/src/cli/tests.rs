//! Tests of the CLI engines' public surface: vendors, building from config, capabilities, redaction.

use super::*;

#[test]
fn every_vendor_has_an_id_and_a_title() {
    for vendor in Vendor::ALL {
        assert_eq!(Vendor::from_id(vendor.id()), Some(vendor));
        assert!(EngineId::parse(vendor.id()).is_ok());
        assert!(!vendor.title().is_empty());
    }
    assert_eq!(Vendor::from_id("kimi"), None);
}

#[test]
fn build_makes_every_enabled_vendor() {
    let ctx = CliContext::default();
    let ids = |sections: &EngineSections| -> Vec<String> {
        build_cli_engines(sections, &ctx).iter().map(|e| e.id().to_string()).collect()
    };
    assert_eq!(ids(&EngineSections::default()), ["claude", "codex", "opencode", "pi", "droid"]);
    let disabled = EngineSection { enabled: Some(false), ..EngineSection::default() };
    let sections: EngineSections =
        [("pi".to_owned(), disabled.clone()), ("droid".to_owned(), disabled)].into_iter().collect();
    assert_eq!(ids(&sections), ["claude", "codex", "opencode"]);
}

#[test]
fn only_claude_with_steering_can_steer() {
    let ctx = CliContext::default();
    let steering = EngineSection { steering: Some(true), ..EngineSection::default() };
    for vendor in Vendor::ALL {
        assert!(!CliEngine::new(vendor, &EngineSection::default(), &ctx).capabilities().steer);
        assert_eq!(
            CliEngine::new(vendor, &steering, &ctx).capabilities().steer,
            vendor == Vendor::Claude
        );
    }
}

#[test]
fn api_keys_never_show_in_debug_output() {
    let ctx = CliContext {
        api_keys: BTreeMap::from([("claude".to_owned(), ApiKey::new("sk-very-secret"))]),
        ..CliContext::default()
    };
    let engine = CliEngine::new(Vendor::Claude, &EngineSection::default(), &ctx);
    for debug in [format!("{engine:?}"), format!("{ctx:?}")] {
        assert!(!debug.contains("sk-very-secret"), "{debug}");
    }
}

#[test]
fn the_run_model_wins_without_its_prefix() {
    let section =
        EngineSection { model: Some("configured".to_owned()), ..EngineSection::default() };
    let settings = CliSettings::from_section(Vendor::Claude, &section);
    let base = BTreeMap::new();
    let input = |model: Option<&'static str>| CommandInput {
        settings: &settings,
        prompt: "p",
        resume: None,
        model,
        cwd: std::path::Path::new("/"),
        base_env: &base,
        max_budget_usd: None,
        gateway_mcp: None,
    };
    let prefixes = ["claude:", "anthropic/"];
    assert_eq!(input(Some("Anthropic/opus")).model(&prefixes).as_deref(), Some("opus"));
    assert_eq!(input(Some("sonnet")).model(&prefixes).as_deref(), Some("sonnet"));
    assert_eq!(input(Some("claude:")).model(&prefixes).as_deref(), Some("configured"));
    assert_eq!(input(None).model(&prefixes).as_deref(), Some("configured"));
}

#[test]
fn a_prompt_argument_never_reads_as_an_option() {
    assert_eq!(prompt_arg("--help me"), " --help me");
    assert_eq!(prompt_arg("help me"), "help me");
}

#[test]
fn values_follow_their_option_in_a_form_no_cli_reads_as_another_option() {
    let settings = |vendor| CliSettings::from_section(vendor, &EngineSection::default());
    let base = BTreeMap::new();
    let argv = |vendor: Vendor, resume: &str, prompt: &str| {
        let settings = settings(vendor);
        let input = CommandInput {
            settings: &settings,
            prompt,
            resume: Some(resume),
            model: Some("opus"),
            cwd: std::path::Path::new("/work"),
            base_env: &base,
            max_budget_usd: None,
            gateway_mcp: None,
        };
        match vendor {
            Vendor::Claude => claude::command(&input),
            Vendor::Codex => codex::command(&input),
            Vendor::Opencode => opencode::command(&input),
            Vendor::Pi => pi::command(&input),
            Vendor::Droid => droid::command(&input),
        }
        .args
    };
    let claude = argv(Vendor::Claude, "sess_1", "--yolo");
    assert!(claude.ends_with(&["--model=opus".to_owned(), "--resume=sess_1".to_owned()]));
    let codex = argv(Vendor::Codex, "sess_1", "--yolo");
    assert!(codex.contains(&"--model=opus".to_owned()), "{codex:?}");
    assert!(codex.ends_with(&["resume", "--", "sess_1", "-"].map(str::to_owned)), "{codex:?}");
    let opencode = argv(Vendor::Opencode, "ses_1", "--yolo");
    assert_eq!(
        opencode,
        ["run", "--format", "json", "--session=ses_1", "--model=opus", "--", "--yolo"]
    );
    let pi = argv(Vendor::Pi, "sess_1", "--yolo");
    assert!(pi.ends_with(&["--session", "sess_1", " --yolo"].map(str::to_owned)), "{pi:?}");
    let pi = argv(Vendor::Pi, "sess_1", "@/etc/passwd");
    assert_eq!(pi.last().map(String::as_str), Some(" @/etc/passwd"));
    let droid = argv(Vendor::Droid, "sess_1", "-x");
    assert!(droid.ends_with(&["--cwd", "/work", " -x"].map(str::to_owned)), "{droid:?}");
    assert_eq!(droid::path_arg(std::path::Path::new("-rf")), "./-rf");
}

#[tokio::test]
async fn an_engine_refuses_to_start_with_a_token_or_model_that_could_be_an_option() {
    let ctx = CliContext::default();
    for vendor in Vendor::ALL {
        let engine = CliEngine::new(vendor, &EngineSection::default(), &ctx);
        let request = |resume: Option<&str>, model: Option<&str>| StartRequest {
            run_id: lemon_core::ids::RunId::generate(),
            session_key: "s".into(),
            prompt: "hi".to_owned(),
            resume: resume.map(|value| ResumeToken::new(vendor.id(), value)),
            cwd: PathBuf::from("/"),
            model: model.map(str::to_owned),
            meta: BTreeMap::new(),
            workspace: None,
            off_limits: lemon_core::contain::OffLimits::none(),
            attachments: Vec::new(),
        };
        for req in [request(Some("--yolo"), None), request(None, Some("--yolo"))] {
            let (sink, _events) = EventSink::channel(8);
            let err = engine.start(req, sink).await.expect_err("refused");
            assert!(
                matches!(&err, EngineError::Start(m) if m.starts_with("invalid ") && !m.contains("--yolo")),
                "{vendor}: {err}"
            );
        }
        assert_eq!(engine.check_resume("--yolo"), Err(InvalidValue::LeadingDash));
    }
    let bad_config = EngineSection { model: Some("-x".to_owned()), ..EngineSection::default() };
    let engine = CliEngine::new(Vendor::Claude, &bad_config, &ctx);
    let (sink, _events) = EventSink::channel(8);
    let req = StartRequest {
        run_id: lemon_core::ids::RunId::generate(),
        session_key: "s".into(),
        prompt: "hi".to_owned(),
        resume: None,
        cwd: PathBuf::from("/"),
        model: None,
        meta: BTreeMap::new(),
        workspace: None,
        off_limits: lemon_core::contain::OffLimits::none(),
        attachments: Vec::new(),
    };
    assert!(engine.start(req, sink).await.is_err());
}

#[test]
fn claude_is_capped_at_what_the_budget_leaves() {
    let settings = CliSettings::from_section(Vendor::Claude, &EngineSection::default());
    let base = BTreeMap::new();
    let argv = |max_budget_usd: Option<f64>| {
        let input = CommandInput {
            settings: &settings,
            prompt: "p",
            resume: None,
            model: None,
            cwd: std::path::Path::new("/"),
            base_env: &base,
            max_budget_usd,
            gateway_mcp: None,
        };
        claude::command(&input).args
    };
    assert!(!argv(None).iter().any(|arg| arg.starts_with("--max-budget-usd")));
    let capped = argv(Some(0.123_456_7));
    assert!(capped.contains(&"--max-budget-usd=0.1234".to_owned()), "{capped:?}");
    // The other vendors have no such flag.
    let codex = codex::command(&CommandInput {
        settings: &CliSettings::from_section(Vendor::Codex, &EngineSection::default()),
        prompt: "p",
        resume: None,
        model: None,
        cwd: std::path::Path::new("/"),
        base_env: &base,
        max_budget_usd: Some(1.0),
        gateway_mcp: None,
    });
    assert!(!codex.args.iter().any(|arg| arg.contains("budget")), "{:?}", codex.args);
}

/// A Claude stand-in that records its command line, the mode and content of
/// its `--mcp-config` file and its environment, then answers.
fn recording_claude(dir: &std::path::Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("claude");
    let out = dir.display();
    let text = format!(
        "#!/bin/sh\nprev=\nfor a in \"$@\"; do [ \"$prev\" = --mcp-config ] && cfg=\"$a\"; prev=\"$a\"; done\n\
         printf '%s\\n' \"$@\" > {out}/argv\nenv > {out}/env\nstat -c %a \"$cfg\" > {out}/mode\n\
         cat \"$cfg\" > {out}/config\ncat > /dev/null\n\
         echo '{{\"type\":\"system\",\"subtype\":\"init\",\"session_id\":\"s1\"}}'\n\
         echo '{{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"result\":\"ok\",\"session_id\":\"s1\"}}'\n"
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[tokio::test]
async fn a_runs_token_reaches_claude_in_a_private_file_that_ends_with_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = lemon_core::config::ApprovalsConfig::default();
    let gate = lemon_core::approvals::Gate::new(
        lemon_core::approvals::Rules::from_config(&config).unwrap(),
        lemon_core::approvals::ApprovalHub::default(),
    );
    gate.set_url("http://127.0.0.1:4041/mcp".to_owned());
    let ctx = CliContext {
        base_env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        gate: Some(gate.clone()),
        ..CliContext::default()
    };
    let section = EngineSection {
        cli_path: Some(recording_claude(dir.path())),
        dangerously_skip_permissions: Some(true),
        ..EngineSection::default()
    };
    let engine = CliEngine::new(Vendor::Claude, &section, &ctx);
    let (sink, mut events) = EventSink::channel(16);
    let req = StartRequest {
        run_id: lemon_core::ids::RunId::generate(),
        session_key: "agent:main:telegram:42".into(),
        prompt: "hi".to_owned(),
        resume: None,
        cwd: dir.path().to_path_buf(),
        model: None,
        meta: BTreeMap::new(),
        workspace: None,
        off_limits: lemon_core::contain::OffLimits::none(),
        attachments: Vec::new(),
    };
    let control = engine.start(req, sink).await.expect("started");
    let completed = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while let Some(event) = events.recv().await {
            if let lemon_core::engine::EngineEvent::Completed(done) = event {
                return done;
            }
        }
        panic!("the run ended without its completion");
    })
    .await
    .expect("the run completes");
    assert!(completed.ok, "{completed:?}");
    control.stopped().await;

    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let argv = read("argv");
    let file = argv.lines().skip_while(|arg| *arg != "--mcp-config").nth(1).expect("--mcp-config");
    assert!(argv.contains("--dangerously-skip-permissions"), "{argv}");
    assert!(!argv.contains("--permission-prompt-tool"), "{argv}");
    assert_eq!(read("mode").trim(), "600");
    let config: serde_json::Value = serde_json::from_str(&read("config")).unwrap();
    let header = config["mcpServers"]["lemon"]["headers"]["Authorization"].as_str().unwrap();
    let token = header.strip_prefix("Bearer ").unwrap();
    assert_eq!(token.len(), 64);
    assert!(!argv.contains(token) && !read("env").contains(token));
    assert!(!std::path::Path::new(file).exists(), "the file is removed once the run is over");
    assert!(!gate.knows(token), "the token is withdrawn once the run is over");
}
