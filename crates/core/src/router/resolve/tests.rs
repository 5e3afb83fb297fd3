//! Resolution rules: resume lines, directives, slash commands, bindings, engine
//! selection, conversation keys, meta flags and models.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::config::load_str;
use crate::router::{model_from_meta, RequestFlags};
use crate::testing::FakeEngine;

fn registry(ids: &[&str]) -> EngineRegistry {
    let mut engines = EngineRegistry::new();
    for id in ids {
        engines.register(Arc::new(FakeEngine::new(id))).unwrap();
    }
    engines
}

fn token(engine: &str, value: &str) -> ResumeToken {
    ResumeToken::new(engine, value)
}

fn check_resume(prompt: &str, expected: Option<(&str, &str, &str)>) {
    let engines = registry(&["echo", "codex"]);
    let found = extract_resume_line(&engines, prompt);
    let expected = expected.map(|(engine, value, prompt)| ExtractedResume {
        token: token(engine, value),
        prompt: prompt.to_owned(),
    });
    assert_eq!(found, expected, "prompt {prompt:?}");
}

#[test]
fn resume_line_is_taken_out_of_the_prompt() {
    check_resume("codex resume abc-1\nfix the test", Some(("codex", "abc-1", "fix the test")));
    check_resume("fix the test\n`echo resume r_2`", Some(("echo", "r_2", "fix the test")));
}

#[test]
fn a_prompt_that_is_only_a_resume_line_continues() {
    check_resume("  codex resume abc  ", Some(("codex", "abc", CONTINUE_PROMPT)));
}

#[test]
fn native_resume_lines_are_known_without_a_native_engine() {
    check_resume("lemon resume s1\nhello", Some(("lemon", "s1", "hello")));
}

#[test]
fn a_resume_command_inside_a_sentence_is_text() {
    check_resume("please run codex resume abc later", None);
    check_resume("unknown resume abc", None);
    check_resume("no resume here", None);
}

#[test]
fn directives_pick_the_engine_and_are_stripped() {
    let engines = registry(&["echo"]);
    let check = |prompt: &str, expected: Option<(&str, &str)>| {
        let expected = expected.map(|(engine, prompt)| {
            Ok(Directive { engine: engine.parse().unwrap(), prompt: prompt.to_owned() })
        });
        assert_eq!(parse_directive(&engines, prompt), expected, "prompt {prompt:?}");
    };
    check("/claude fix the test", Some(("claude", "fix the test")));
    check("/claude:opus  fix it", Some(("claude:opus", "fix it")));
    check("/echo", Some(("echo", CONTINUE_PROMPT)));
    check("/tmp/file is missing", None);
    check("look at /claude docs", None);
    check("/status", None);
}

#[test]
fn slash_commands_are_whole_messages() {
    assert_eq!(parse_slash_command("/cancel"), Some(SlashCommand::Cancel));
    assert_eq!(parse_slash_command(" /NEW "), Some(SlashCommand::New));
    assert_eq!(parse_slash_command("/status"), Some(SlashCommand::Status));
    assert_eq!(
        parse_slash_command("/engine codex"),
        Some(SlashCommand::Engine(Some("codex".into())))
    );
    assert_eq!(parse_slash_command("/engine"), Some(SlashCommand::Engine(None)));
    assert_eq!(parse_slash_command("/cancel the order please"), None);
    assert_eq!(parse_slash_command("please /cancel"), None);
}

/// An engine reference that lives as long as the test, as `EngineInputs` borrows them.
fn e(raw: &str) -> &'static EngineRef {
    Box::leak(Box::new(raw.parse().unwrap()))
}

fn inputs(default_engine: &str) -> EngineInputs<'static> {
    EngineInputs {
        explicit_resume: None,
        chosen: None,
        chat_state: None,
        binding_engine: None,
        default_engine: e(default_engine),
        native_only: false,
    }
}

fn choice(engine: &str, resume: Option<ResumeToken>, source: Option<ResumeSource>) -> EngineChoice {
    EngineChoice { engine: engine.parse().unwrap(), resume, source }
}

#[test]
fn engine_priority_resume_then_directive_then_binding_then_default() {
    let explicit = token("codex", "t1");
    let all = EngineInputs {
        explicit_resume: Some(explicit.clone()),
        chosen: Some(e("claude")),
        chat_state: Some(token("pi", "p1")),
        binding_engine: Some(e("droid")),
        ..inputs("echo")
    };
    assert_eq!(
        choose_engine(all.clone()),
        Ok(choice("codex", Some(explicit), Some(ResumeSource::Explicit)))
    );
    let no_explicit = EngineInputs { explicit_resume: None, ..all.clone() };
    assert_eq!(choose_engine(no_explicit.clone()), Ok(choice("claude", None, None)));
    let no_choice = EngineInputs { chosen: None, ..no_explicit.clone() };
    assert_eq!(
        choose_engine(no_choice.clone()),
        Ok(choice("pi", Some(token("pi", "p1")), Some(ResumeSource::Auto)))
    );
    let fresh = EngineInputs { chat_state: None, ..no_choice };
    assert_eq!(choose_engine(fresh.clone()), Ok(choice("droid", None, None)));
    let unbound = EngineInputs { binding_engine: None, ..fresh };
    assert_eq!(choose_engine(unbound), Ok(choice("echo", None, None)));
}

#[test]
fn auto_resume_applies_to_a_chosen_engine_only_when_it_matches() {
    let stored = token("claude", "c1");
    let composite = EngineInputs {
        chosen: Some(e("claude:opus")),
        chat_state: Some(stored.clone()),
        ..inputs("echo")
    };
    assert_eq!(
        choose_engine(composite),
        Ok(choice("claude:opus", Some(stored), Some(ResumeSource::Auto)))
    );
}

#[test]
fn native_only_rejects_explicit_vendor_tokens_and_ignores_stored_ones() {
    let explicit = EngineInputs {
        explicit_resume: Some(token("codex", "t1")),
        native_only: true,
        ..inputs("echo")
    };
    assert_eq!(
        choose_engine(explicit),
        Err(ChoiceError::UnsupportedResumeEngine { engine: "codex".to_owned() })
    );
    let stored = EngineInputs {
        chosen: Some(e("claude")),
        chat_state: Some(token("codex", "t1")),
        native_only: true,
        ..inputs("echo")
    };
    assert_eq!(choose_engine(stored), Ok(choice("lemon", None, None)));
    let native = EngineInputs {
        chat_state: Some(token("lemon", "n1")),
        native_only: true,
        ..inputs("echo")
    };
    assert_eq!(
        choose_engine(native),
        Ok(choice("lemon", Some(token("lemon", "n1")), Some(ResumeSource::Auto)))
    );
}

#[test]
fn conversation_keys() {
    assert_eq!(conversation_key(&SessionKey::from("s1"), None).as_str(), "session:s1");
    assert_eq!(conversation_key(&SessionKey::from("  "), None).as_str(), "session:default");
    assert_eq!(
        conversation_key(&SessionKey::from("s1"), Some(&token("codex", "abc"))).as_str(),
        "resume:codex:abc"
    );
}

#[test]
fn queue_mode_request_then_binding_then_config_then_collect() {
    use QueueMode::*;
    assert_eq!(queue_mode(Some(Steer), Some(Followup), Some(Interrupt)), Steer);
    assert_eq!(queue_mode(None, Some(Followup), Some(Interrupt)), Followup);
    assert_eq!(queue_mode(None, None, Some(Interrupt)), Interrupt);
    assert_eq!(queue_mode(None, None, None), Collect);
}

#[test]
fn bindings_prefer_the_topic_then_the_chat_then_the_project() {
    let loaded = load_str(
        r#"
        [gateway.projects.app]
        root = "/srv/app"
        default_engine = "codex"

        [[gateway.bindings]]
        transport = "telegram"
        chat_id = 42
        project = "app"
        queue_mode = "followup"
        agent_id = "helper"
        tools = ["bash", "github__*"]

        [[gateway.bindings]]
        transport = "telegram"
        chat_id = 42
        topic_id = "7"
        default_engine = "claude"
        queue_mode = "steer"
        tools = ["github__search"]
        "#,
        std::path::Path::new("config.toml"),
    )
    .unwrap();
    let config = loaded.config.gateway;
    let chat =
        ChannelRef { transport: "telegram".into(), chat_id: Some("42".into()), topic_id: None };
    assert_eq!(
        resolve_binding(&config, &chat),
        BindingDefaults {
            cwd: Some("/srv/app".into()),
            agent_id: Some("helper".into()),
            default_engine: Some("codex".parse().unwrap()),
            queue_mode: Some(QueueMode::Followup),
            budget: None,
            project: Some("app".into()),
            tools: Some(vec!["bash".into(), "github__*".into()]),
        }
    );
    let topic = ChannelRef { topic_id: Some("7".into()), ..chat.clone() };
    assert_eq!(
        resolve_binding(&config, &topic),
        BindingDefaults {
            cwd: Some("/srv/app".into()),
            agent_id: Some("helper".into()),
            default_engine: Some("claude".parse().unwrap()),
            queue_mode: Some(QueueMode::Steer),
            budget: None,
            project: Some("app".into()),
            tools: Some(vec!["github__search".into()]),
        }
    );
    let other = ChannelRef { chat_id: Some("43".into()), ..chat };
    assert_eq!(resolve_binding(&config, &other), BindingDefaults::default());
}

#[test]
fn a_run_belongs_to_its_bindings_project_else_the_deepest_root_holding_its_directory() {
    let loaded = load_str(
        r#"
        [gateway.projects.srv]
        root = "/srv"

        [gateway.projects.app]
        root = "/srv/app"
        "#,
        std::path::Path::new("config.toml"),
    )
    .unwrap();
    let config = loaded.config.gateway;
    let check = |bound: Option<&str>, cwd: Option<&str>, expected: Option<&str>| {
        let found = project_of(&config, bound, cwd.map(std::path::Path::new));
        let root = found.map(|p| p.root.to_string_lossy().into_owned());
        let expected = expected.map(|id| config.projects[id].root.to_string_lossy().into_owned());
        assert_eq!(root, expected, "bound {bound:?}, cwd {cwd:?}");
    };
    check(Some("srv"), Some("/srv/app/src"), Some("srv"));
    check(None, Some("/srv/app/src"), Some("app"));
    check(None, Some("/srv/other"), Some("srv"));
    check(None, Some("/srv2"), None);
    check(None, None, None);
    check(Some("gone"), Some("/srv/app"), None);
}

#[test]
fn the_request_the_project_and_the_binding_narrow_the_tools_in_turn() {
    use crate::mcp::{ToolFilter, META_KEY};
    let list = |patterns: &[&str]| patterns.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
    let project = list(&["bash", "read", "github__*"]);
    let binding = list(&["bash", "github__*"]);

    let mut meta = BTreeMap::new();
    narrow_tools(&mut meta, None, None);
    assert!(!meta.contains_key(META_KEY), "no list, no filter: every tool");

    let mut meta = BTreeMap::new();
    ToolFilter::narrow_meta(&mut meta, &list(&["github__search", "read"]));
    narrow_tools(&mut meta, Some(&project), Some(&binding));
    let filter = ToolFilter::from_meta(&meta);
    assert_eq!(filter.lists().len(), 3);
    assert!(filter.allows("github__search"));
    assert!(!filter.allows("read"), "the binding leaves read out");
    assert!(!filter.allows("bash"), "the request leaves bash out");
    assert!(!filter.allows("github__push"), "the request leaves github__push out");

    let mut meta = BTreeMap::new();
    narrow_tools(&mut meta, Some(&project), None);
    let filter = ToolFilter::from_meta(&meta);
    assert!(filter.allows("read") && !filter.allows("write"));

    let mut meta = BTreeMap::new();
    narrow_tools(&mut meta, None, Some(&[]));
    assert!(!ToolFilter::from_meta(&meta).allows("bash"), "an empty list leaves no tool");
}

#[test]
fn meta_flags() {
    let mut meta = BTreeMap::new();
    meta.insert("disable_auto_resume".to_owned(), serde_json::json!(true));
    meta.insert("goal_continuation".to_owned(), serde_json::json!("false"));
    meta.insert("task_auto_followup".to_owned(), serde_json::json!(1));
    let flags = RequestFlags::from_meta(&meta);
    assert!(flags.no_auto_resume);
    assert!(!flags.goal_continuation);
    assert!(flags.auto_followup);
    assert_eq!(RequestFlags::from_meta(&BTreeMap::new()), RequestFlags::default());
    let flag = |key: &str, value: serde_json::Value| {
        RequestFlags::from_meta(&BTreeMap::from([(key.to_owned(), value)]))
    };
    assert!(flag("goal_continuation", "yes".into()).goal_continuation);
    assert!(!flag("goal_continuation", "".into()).goal_continuation);
    assert!(!flag("disable_auto_resume", 0.into()).no_auto_resume);
    assert!(flag("delegated_auto_followup", true.into()).auto_followup);
    assert!(flag("async_followups", serde_json::json!([{"id": 1}])).auto_followup);
    assert!(!flag("async_followups", serde_json::json!([])).auto_followup);
}

#[test]
fn resume_tokens_are_checked_by_their_engine_and_refusals_name_the_field() {
    let engines = registry(&["claude"]);
    let check = |engine: &str, value: &str| {
        check_resume_token(&engines, &token(engine, value), Field::ResumeEngine, Field::ResumeValue)
    };
    assert_eq!(check("claude", "5b1c7a52-8f0e-4d7b-9c1a-2f3e4d5c6b7a"), Ok(()));
    assert_eq!(check("claude:opus", "sess_1"), Ok(()));
    assert_eq!(
        check("claude", "--dangerously-skip-permissions"),
        Err(Refusal {
            field: Field::ResumeValue,
            what: "invalid resume token for claude".to_owned(),
            why: InvalidValue::LeadingDash,
        })
    );
    assert_eq!(check("claude:-x", "sess_1").map_err(|r| r.field), Err(Field::ResumeEngine));
    // An unknown engine is the unknown-engine check's to report.
    assert_eq!(check("nope", "sess_1"), Ok(()));
    let odd = check_engine_model("Bad\nId:-x", Field::Engine).unwrap_err();
    assert_eq!(odd.what, "invalid model for the engine", "the caller's text is not repeated");
}

#[test]
fn only_a_non_blank_string_meta_model_is_taken_and_checked() {
    let meta = |value: serde_json::Value| BTreeMap::from([("model".to_owned(), value)]);
    assert_eq!(model_from_meta(&BTreeMap::new()), None);
    assert_eq!(model_from_meta(&meta(" opus ".into())).as_deref(), Some("opus"));
    assert_eq!(model_from_meta(&meta("  ".into())), None);
    assert_eq!(model_from_meta(&meta(7.into())), None);
    assert_eq!(check_request_model("opus", "claude"), Ok(()));
    let model = model_from_meta(&meta("opus --yolo".into())).unwrap();
    let refused = check_request_model(&model, "claude:opus").unwrap_err();
    assert_eq!((refused.field, refused.why), (Field::MetaModel, InvalidValue::Character));
    assert_eq!(refused.what, "invalid model for claude");
}
