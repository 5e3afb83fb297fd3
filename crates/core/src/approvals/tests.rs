use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::config::{ApprovalAction, ApprovalRuleConfig, ApprovalsConfig};

fn rule(tool: &str, pattern: Option<&str>, action: ApprovalAction) -> ApprovalRuleConfig {
    ApprovalRuleConfig { tool: tool.to_owned(), pattern: pattern.map(str::to_owned), action }
}

fn policy(rules: Vec<ApprovalRuleConfig>) -> Policy {
    Policy::from_config(&ApprovalsConfig {
        timeout_ms: 1_000,
        rules: Some(rules),
        ..ApprovalsConfig::default()
    })
    .unwrap()
}

#[test]
fn the_first_matching_rule_decides_and_no_match_allows() {
    let policy = policy(vec![
        rule("bash", Some("rm *"), ApprovalAction::Deny),
        rule("bash", None, ApprovalAction::Ask),
        rule("read", Some("/srv/*"), ApprovalAction::Allow),
        rule("*", None, ApprovalAction::Ask),
    ]);
    let verdict = policy.judge("bash", "rm -rf build");
    assert_eq!((verdict.action, verdict.rule), (ApprovalAction::Deny, Some(1)));
    assert_eq!(verdict.rule_text, "tool = \"bash\", match = \"rm *\", action = \"deny\"");
    assert_eq!(policy.judge("bash", "ls").rule, Some(2));
    assert_eq!(policy.judge("read", "/srv/app/src/main.rs").action, ApprovalAction::Allow);
    assert_eq!(policy.judge("read", "/etc/hosts").rule, Some(4));
    let none = Policy::default().judge("bash", "rm -rf /");
    assert_eq!((none.action, none.rule), (ApprovalAction::Allow, None));
    // A tool's name matches in any case (Claude Code's `Bash`, `Read`); the
    // subject keeps its case.
    assert_eq!(policy.judge("Bash", "rm -rf build").action, ApprovalAction::Deny);
    assert_eq!(policy.judge("Read", "/srv/app").action, ApprovalAction::Allow);
    assert_eq!(policy.judge("bash", "RM -rf build").rule, Some(2));
}

#[test]
fn untrusted_runs_read_freely_never_fetch_and_are_asked_about_the_rest() {
    let policy = Policy::untrusted_from_config(&ApprovalsConfig::default()).unwrap();
    for tool in ["read", "list", "grep", "glob"] {
        assert_eq!(policy.judge(tool, "/work/src").action, ApprovalAction::Allow, "{tool}");
    }
    let fetch = policy.judge("fetch", "example.com");
    assert_eq!((fetch.action, fetch.rule), (ApprovalAction::Deny, Some(2)));
    assert_eq!(fetch.rule_text, "untrusted: tool = \"fetch\", action = \"deny\"");
    for tool in ["bash", "write", "edit", "send_message", "cron", "search__web"] {
        assert_eq!(policy.judge(tool, "x").action, ApprovalAction::Ask, "{tool}");
    }
    // The owner's own list replaces the defaults.
    let own = ApprovalsConfig {
        untrusted: Some(vec![
            rule("fetch", Some("api.github.com"), ApprovalAction::Allow),
            rule("*", None, ApprovalAction::Deny),
        ]),
        ..ApprovalsConfig::default()
    };
    let policy = Policy::untrusted_from_config(&own).unwrap();
    assert_eq!(policy.judge("fetch", "api.github.com").action, ApprovalAction::Allow);
    assert_eq!(policy.judge("read", "/work").action, ApprovalAction::Deny);
    assert!(!Policy::from_config(&own).unwrap().is_empty(), "the owner's defaults stay");
}

#[test]
fn by_default_reads_run_and_every_side_effect_is_asked_about() {
    let policy = Policy::from_config(&ApprovalsConfig::default()).unwrap();
    for tool in ["read", "list", "grep", "glob", "Read", "Grep", "Glob", "LS", "sms_list_messages"]
    {
        assert_eq!(policy.judge(tool, "/work/src").action, ApprovalAction::Allow, "{tool}");
    }
    for tool in ["bash", "write", "edit", "fetch", "cron", "sms_claim_message", "Bash", "Edit"] {
        let verdict = policy.judge(tool, "x");
        assert_eq!((verdict.action, verdict.rule), (ApprovalAction::Ask, Some(3)), "{tool}");
        assert_eq!(verdict.rule_text, "tool = \"*\", action = \"ask\"");
    }
    // `rules = []` is the owner saying: allow everything.
    let open = ApprovalsConfig { rules: Some(Vec::new()), ..ApprovalsConfig::default() };
    let policy = Policy::from_config(&open).unwrap();
    assert!(policy.is_empty());
    assert_eq!(policy.judge("bash", "rm -rf build").action, ApprovalAction::Allow);
}

#[test]
fn a_rule_that_is_not_a_glob_is_named_by_its_index_and_key() {
    let config = ApprovalsConfig {
        timeout_ms: 1_000,
        rules: Some(vec![
            rule("bash", None, ApprovalAction::Ask),
            rule("bash", Some("[x"), ApprovalAction::Deny),
        ]),
        ..ApprovalsConfig::default()
    };
    let (index, key, _) = Policy::from_config(&config).unwrap_err();
    assert_eq!((index, key), (1, "match"));
}

#[test]
fn the_subject_is_the_command_the_resolved_path_or_the_host() {
    let cwd = Path::new("/work/project");
    assert_eq!(subject("bash", &json!({ "command": "rm -rf build" }), cwd), "rm -rf build");
    assert_eq!(subject("write", &json!({ "path": "../other/x.txt" }), cwd), "/work/other/x.txt");
    assert_eq!(subject("read", &json!({ "path": "/etc/./hosts" }), cwd), "/etc/hosts");
    assert_eq!(subject("list", &json!({}), cwd), "/work/project");
    let fetch = |url: &str| subject("fetch", &json!({ "url": url }), cwd);
    assert_eq!(fetch("https://user:pw@example.com:8443/a?b"), "example.com");
    assert_eq!(fetch("http://[::1]:80/"), "::1");
    assert_eq!(subject("cron", &json!({ "action": "list" }), cwd), "{\"action\":\"list\"}");
    // Claude Code's tools name their subject their own way.
    assert_eq!(subject("Bash", &json!({ "command": "make" }), cwd), "make");
    assert_eq!(subject("Edit", &json!({ "file_path": "src/a.rs" }), cwd), "/work/project/src/a.rs");
    assert_eq!(subject("WebFetch", &json!({ "url": "https://docs.rs/x" }), cwd), "docs.rs");
}

fn request(timeout: Duration) -> ApprovalRequest {
    ApprovalRequest {
        run_id: "run_1".to_owned(),
        session_key: "agent:main:main".to_owned(),
        tool: "bash".to_owned(),
        subject: "x".repeat(SUBJECT_CHARS + 10),
        rule: "tool = \"bash\", action = \"ask\"".to_owned(),
        untrusted: None,
        timeout,
    }
}

#[tokio::test(start_paused = true)]
async fn one_answer_settles_a_request_and_a_second_is_told_what_settled_it() {
    let hub = ApprovalHub::default();
    let waiting = hub.ask(request(Duration::from_secs(600)));
    let id = waiting.request.id.clone();
    let pending = hub.pending();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].subject.chars().count(), SUBJECT_CHARS + 1, "cut, with an ellipsis");
    assert_eq!(pending[0].expires_at_ms - pending[0].requested_at_ms, 600_000);
    hub.answer(&id, true, "api", "api").unwrap();
    let Outcome::Answered(answer) = waiting.outcome().await else { panic!("answered") };
    assert!(answer.approved);
    assert_eq!((answer.by.as_str(), answer.via.as_str()), ("api", "api"));
    assert!(hub.pending().is_empty());
    let second = hub.answer(&id, false, "alice", "telegram").unwrap_err();
    assert_eq!(
        second.to_string(),
        format!("approval request {id} was already approved by api via api")
    );
    assert_eq!(
        hub.answer("apr_unknown", true, "api", "api"),
        Err(AnswerError::NotFound("apr_unknown".to_owned()))
    );
    assert!(is_request_id(&id), "{id}");
    for hostile in
        ["apr_unknown", "apr_0123456789ab\nforged log line", "apr_0123456789AB", "", "apr_"]
    {
        assert!(!is_request_id(hostile), "{hostile:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_request_expires_denied_and_a_dropped_one_is_withdrawn() {
    let hub = ApprovalHub::default();
    let waiting = hub.ask(request(Duration::from_secs(600)));
    let id = waiting.request.id.clone();
    assert_eq!(waiting.outcome().await, Outcome::Expired);
    assert!(hub.pending().is_empty());
    let late = hub.answer(&id, true, "api", "api").unwrap_err();
    assert!(late.to_string().ends_with("expired without an answer"), "{late}");

    let waiting = hub.ask(request(Duration::from_secs(600)));
    let id = waiting.request.id.clone();
    drop(waiting);
    assert!(hub.pending().is_empty());
    let late = hub.answer(&id, true, "api", "api").unwrap_err();
    assert!(late.to_string().contains("the run ended while it waited"), "{late}");
}

#[tokio::test(start_paused = true)]
async fn a_text_reply_answers_by_code_only_in_the_conversation_that_was_asked() {
    let hub = ApprovalHub::default();
    let first = hub.ask(request(Duration::from_secs(600)));
    let second = hub.ask(request(Duration::from_secs(600)));
    let code = first.request.code.clone();
    assert_eq!(code.len(), 4, "{code}");
    assert!(code.bytes().all(|b| b.is_ascii_digit()), "{code}");
    assert_ne!(code, second.request.code, "waiting requests have their own codes");
    let elsewhere =
        hub.answer_code("sms:+15550001111", &code, Reply::Approve, "+15550001111", "sms");
    assert_eq!(elsewhere, Err(AnswerError::NotFound(code.clone())));
    let answered =
        hub.answer_code("agent:main:main", &code, Reply::Deny, "+15550002222", "sms").unwrap();
    assert_eq!(answered.id, first.request.id);
    let Outcome::Answered(answer) = first.outcome().await else { panic!("answered") };
    assert!(!answer.approved);
    assert_eq!(
        hub.answer_code("agent:main:main", &code, Reply::Approve, "x", "sms"),
        Err(AnswerError::NotFound(code)),
        "a settled request takes no second reply"
    );
    assert_eq!(hub.pending().len(), 1);
    drop(second);
}

#[tokio::test(start_paused = true)]
async fn always_leaves_a_standing_yes_for_calls_like_it_in_its_session_only() {
    let hub = ApprovalHub::default();
    let ask = |tool: &str, subject: &str| {
        hub.ask(ApprovalRequest {
            tool: tool.to_owned(),
            subject: subject.to_owned(),
            ..request(Duration::from_secs(600))
        })
    };
    let session = "agent:main:main";

    let command = ask("bash", "cargo test --workspace");
    let id = command.request.id.clone();
    hub.reply(&id, Reply::Always, "@ann", "telegram").unwrap();
    let Outcome::Answered(answer) = command.outcome().await else { panic!("answered") };
    assert!(answer.approved && answer.for_session, "{answer:?}");
    let how = hub.granted(session, "bash", "cargo test --workspace");
    assert_eq!(how.as_deref(), Some("approved for this session by @ann via telegram"));
    assert_eq!(hub.granted(session, "Bash", "cargo test --workspace"), how, "any case");
    assert_eq!(hub.granted(session, "bash", "cargo test; rm -rf /"), None, "the same command only");
    assert_eq!(hub.granted("agent:main:other", "bash", "cargo test --workspace"), None);
    let late = hub.answer(&id, false, "api", "api").unwrap_err();
    assert!(late.to_string().contains("approved for this session by @ann"), "{late}");

    // A file: anything under its directory, nothing beside it.
    let write = ask("write", "/work/project/src/main.rs");
    hub.reply(&write.request.id, Reply::Always, "api", "api").unwrap();
    assert!(hub.granted(session, "write", "/work/project/src/lib/mod.rs").is_some());
    assert_eq!(hub.granted(session, "write", "/work/project/src-other/x.rs"), None);
    assert_eq!(hub.granted(session, "write", "/work/project/Cargo.toml"), None);
    assert_eq!(hub.granted(session, "edit", "/work/project/src/main.rs"), None, "another tool");

    // A plain yes grants nothing.
    let fetch = ask("fetch", "example.com");
    hub.reply(&fetch.request.id, Reply::Approve, "api", "api").unwrap();
    assert_eq!(hub.granted(session, "fetch", "example.com"), None);
}

#[test]
fn an_edit_replaces_the_rules_in_force_for_the_next_call() {
    let rules = Rules::default();
    assert_eq!(rules.for_run(false).judge("bash", "ls").action, ApprovalAction::Ask);
    let edited = ApprovalsConfig {
        rules: Some(vec![rule("bash", Some("ls*"), ApprovalAction::Allow)]),
        ..ApprovalsConfig::default()
    };
    let shared = rules.clone();
    shared.replace(&crate::config::GatewayConfig { approvals: edited, ..Default::default() });
    assert_eq!(rules.for_run(false).judge("bash", "ls -l").action, ApprovalAction::Allow);
    assert_eq!(rules.for_run(true).judge("bash", "ls -l").action, ApprovalAction::Ask, "untrusted");
}

#[test]
fn a_runs_binding_project_and_engine_rules_come_before_the_owners() {
    let config: crate::config::GatewayConfig = toml::from_str(
        r#"
        [approvals.engines]
        codex = [{ tool = "bash", match = "cargo *", action = "allow" }]

        [projects.site]
        root = "/srv/site"
        approvals = [{ tool = "bash", match = "make *", action = "allow" }]

        [[bindings]]
        transport = "telegram"
        chat_id = 42
        project = "site"
        approvals = [
          { tool = "bash", match = "rm *", action = "deny" },
          { tool = "write", action = "allow" },
        ]
        "#,
    )
    .unwrap();
    let rules = Rules::from_gateway(&config).unwrap();
    let none = std::collections::BTreeMap::new();
    let chat = std::collections::BTreeMap::from([(
        "channel".to_owned(),
        crate::router::ChannelRef {
            transport: "telegram".into(),
            chat_id: Some("42".into()),
            topic_id: None,
        }
        .to_meta(),
    )]);
    let judge = |engine: &str, cwd: &str, meta, untrusted, call: &str| {
        let scope = RunScope { untrusted, engine, cwd: Path::new(cwd), meta };
        let (tool, subject) = call.split_once(": ").unwrap();
        let verdict = rules.for_scope(&scope).judge(tool, subject);
        (verdict.action, verdict.rule_text)
    };
    let (allow, ask, deny) = (ApprovalAction::Allow, ApprovalAction::Ask, ApprovalAction::Deny);
    // A run in the project's directory, from the API.
    let made = judge("lemon", "/srv/site/docs", &none, false, "bash: make html");
    assert_eq!(
        made,
        (allow, r#"project "site": tool = "bash", match = "make *", action = "allow""#.to_owned())
    );
    assert_eq!(
        judge("lemon", "/srv/site", &none, false, "bash: ls").0,
        ask,
        "the owner's rules follow"
    );
    assert_eq!(
        judge("lemon", "/srv/other", &none, false, "bash: make html").0,
        ask,
        "not the project's"
    );
    // The engine's rules, wherever it runs.
    let cargo = judge("codex", "/tmp", &none, false, "bash: cargo test");
    assert_eq!(
        cargo,
        (allow, r#"engine codex: tool = "bash", match = "cargo *", action = "allow""#.to_owned())
    );
    assert_eq!(judge("lemon", "/tmp", &none, false, "bash: cargo test").0, ask);
    // The bound chat: its rules first, then its project's, wherever the run is.
    let rm = judge("lemon", "/tmp", &chat, false, "bash: rm -rf build");
    assert_eq!(
        rm,
        (deny, r#"binding telegram:42: tool = "bash", match = "rm *", action = "deny""#.to_owned())
    );
    assert_eq!(judge("lemon", "/tmp", &chat, false, "bash: make html").0, allow);
    assert_eq!(judge("lemon", "/tmp", &chat, false, "write: /tmp/a").0, allow);
    // An untrusted run takes a scope's denials only.
    assert_eq!(judge("lemon", "/tmp", &chat, true, "bash: rm -rf build").0, deny);
    let write = judge("lemon", "/tmp", &chat, true, "write: /tmp/a");
    assert_eq!(write, (ask, r#"untrusted: tool = "*", action = "ask""#.to_owned()));
    assert_eq!(judge("codex", "/srv/site", &none, true, "bash: cargo test").0, ask);
}
