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
    let ids = |sections: &BTreeMap<String, EngineSection>| -> Vec<String> {
        build_cli_engines(sections, &ctx).iter().map(|e| e.id().to_string()).collect()
    };
    assert_eq!(ids(&BTreeMap::new()), ["claude", "codex", "opencode", "pi", "droid"]);
    let disabled = EngineSection { enabled: Some(false), ..EngineSection::default() };
    let sections =
        BTreeMap::from([("pi".to_owned(), disabled.clone()), ("droid".to_owned(), disabled)]);
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
