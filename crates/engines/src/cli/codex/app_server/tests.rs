//! Tests of the app-server client: the transcript of a real Codex 0.171.0
//! approval becomes the `exec --json` stream the Codex parser reads, and
//! every approval request gets the gate's answer.

use std::path::PathBuf;

use lemon_core::approvals::{ApprovalHub, Gate, Rules, RunTicket};
use lemon_core::config::{ApprovalAction, ApprovalRuleConfig, ApprovalsConfig};
use lemon_core::engine::{EngineEvent, EventSink};

use super::*;
use crate::cli::translate::{ParseContext, Translator};
use crate::cli::Vendor;

const TRANSCRIPT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/cli/codex/real_0.171.0_app_server_approval.jsonl"
));

fn turn(resume: Option<&str>) -> Turn {
    Turn {
        prompt: "run the command".to_owned(),
        model: Some("fake-model".to_owned()),
        cwd: PathBuf::from("/home/dev/proj"),
        resume: resume.map(str::to_owned),
    }
}

/// A gate with `rules` and an asker registered with it.
fn asker(rules: Vec<ApprovalRuleConfig>) -> (Asker, lemon_core::approvals::Registration) {
    let config =
        ApprovalsConfig { timeout_ms: 60_000, rules: Some(rules), ..ApprovalsConfig::default() };
    let gate = Gate::new(Rules::from_config(&config).unwrap(), ApprovalHub::default());
    let (sink, _events) = EventSink::channel(8);
    let registration = gate.register(RunTicket {
        run_id: "run_1".into(),
        session_key: "agent:main:main".into(),
        engine: "codex".into(),
        cwd: PathBuf::from("/home/dev/proj"),
        meta: Default::default(),
        sink,
    });
    (Asker::new(gate, registration.token.clone()), registration)
}

fn rule(tool: &str, pattern: Option<&str>, action: ApprovalAction) -> ApprovalRuleConfig {
    ApprovalRuleConfig { tool: tool.into(), pattern: pattern.map(str::to_owned), action }
}

#[tokio::test]
async fn a_real_transcript_reads_as_the_exec_stream() {
    let (asker, _registration) = asker(Vec::new());
    let mut client = Client::new(None, turn(None));
    let mut answers = JoinSet::new();
    let mut translator = Translator::new(
        Vendor::Codex,
        Box::new(super::super::Parser::new(ParseContext::default())),
        None,
    );
    // The client's own responses are in the transcript; its thread id comes
    // from the `thread/start` result.
    let mut events = Vec::new();
    for line in TRANSCRIPT.lines() {
        for out in client.message(line, &asker, &mut answers) {
            events.extend(translator.line(&out));
        }
    }
    let started = events.iter().find_map(|event| match event {
        EngineEvent::Started { resume, .. } => resume.clone(),
        _ => None,
    });
    assert_eq!(
        started.map(|token| token.value),
        Some("01a24799-d4ea-7401-9026-cf7af433f632".to_owned())
    );
    let command: Vec<_> = events
        .iter()
        .filter_map(|event| match event {
            EngineEvent::Action(action) if action.id == "call_lemon_1" => Some(action),
            _ => None,
        })
        .collect();
    assert_eq!(command.len(), 2, "{command:?}");
    assert_eq!(command[0].title, "/bin/bash -lc 'touch lemon-made.txt && echo made'");
    assert_eq!(command[1].ok, Some(true), "{:?}", command[1]);
    let Some(EngineEvent::Completed(done)) = events.last() else { panic!("{events:?}") };
    assert!(done.ok, "{done:?}");
    assert_eq!(done.answer, "done");
    assert_eq!(done.usage["input_tokens"], 20);
    assert_eq!(done.usage["output_tokens"], 10);
    assert!(client.stdin.is_none(), "stdin closes once the turn is over");
    // The approval request was judged (no rule: allowed) and answered.
    let (id, answer) = answers.join_next().await.unwrap().unwrap();
    assert_eq!((id, answer), (json!(0), json!({ "decision": "accept" })));
}

#[tokio::test]
async fn command_and_file_requests_are_judged_by_the_owners_rules() {
    let (asker, _registration) = asker(vec![
        rule("bash", Some("rm *"), ApprovalAction::Deny),
        rule("edit", Some("/home/dev/proj/*"), ApprovalAction::Allow),
        rule("*", None, ApprovalAction::Deny),
    ]);
    let mut client = Client::new(None, turn(None));
    let mut answers = JoinSet::new();
    let request = |id: u64, method: &str, params: Value| {
        json!({ "id": id, "method": method, "params": params }).to_string()
    };
    let rm = json!({ "itemId": "c1", "command": "/bin/bash -lc 'rm -rf x'", "commandActions": [{ "type": "unknown", "command": "rm -rf x" }] });
    client.message(&request(7, "item/commandExecution/requestApproval", rm), &asker, &mut answers);
    // A file change is judged by the paths its item named.
    let item = json!({ "method": "item/started", "params": { "item": { "type": "fileChange", "id": "f1", "status": "inProgress", "changes": [
        { "path": "/home/dev/proj/a.txt", "kind": { "type": "update" }, "diff": "" },
    ] } } });
    let lines = client.message(&item.to_string(), &asker, &mut answers);
    assert_eq!(lines.len(), 1);
    let exec: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        exec["item"],
        json!({ "type": "file_change", "id": "f1", "status": "in_progress", "changes": [{ "path": "/home/dev/proj/a.txt", "kind": "update" }] })
    );
    client.message(
        &request(8, "item/fileChange/requestApproval", json!({ "itemId": "f1" })),
        &asker,
        &mut answers,
    );
    let outside = json!({ "method": "item/started", "params": { "item": { "type": "fileChange", "id": "f2", "status": "inProgress", "changes": [
        { "path": "/home/dev/proj/b.txt", "kind": { "type": "add" }, "diff": "" },
        { "path": "/etc/passwd", "kind": { "type": "update" }, "diff": "" },
    ] } } });
    client.message(&outside.to_string(), &asker, &mut answers);
    client.message(
        &request(9, "item/fileChange/requestApproval", json!({ "itemId": "f2" })),
        &asker,
        &mut answers,
    );
    let mut got = Vec::new();
    while let Some(answer) = answers.join_next().await {
        got.push(answer.unwrap());
    }
    got.sort_by_key(|(id, _)| id.as_u64());
    assert_eq!(
        got,
        [
            (json!(7), json!({ "decision": "decline" })),
            (json!(8), json!({ "decision": "accept" })),
            (json!(9), json!({ "decision": "decline" })),
        ],
        "one path outside the allowed ones declines the whole change"
    );
}

#[test]
fn the_client_starts_or_resumes_and_a_refusal_fails_the_turn() {
    let (asker, _registration) = asker(Vec::new());
    let mut answers = JoinSet::new();
    let mut client = Client::new(None, turn(Some("thr_1")));
    assert!(client.message(r#"{"id":1,"result":{}}"#, &asker, &mut answers).is_empty());
    let started =
        client.message(r#"{"id":2,"result":{"thread":{"id":"thr_1"}}}"#, &asker, &mut answers);
    assert_eq!(started, [r#"{"thread_id":"thr_1","type":"thread.started"}"#]);
    let refused = client.message(
        r#"{"id":3,"error":{"code":-32600,"message":"no such thread"}}"#,
        &asker,
        &mut answers,
    );
    let failed: Value = serde_json::from_str(&refused[0]).unwrap();
    assert_eq!(failed["type"], "turn.failed");
    assert_eq!(failed["error"]["message"], "codex app-server refused the run: no such thread");
    assert!(client.stdin.is_none());
    // A failed or interrupted turn fails the run with its error.
    let mut client = Client::new(None, turn(None));
    let ended = client.message(
        r#"{"method":"turn/completed","params":{"turn":{"status":"interrupted","error":null}}}"#,
        &asker,
        &mut answers,
    );
    assert_eq!(ended, [r#"{"error":{"message":"codex turn interrupted"},"type":"turn.failed"}"#]);
    // Notifications the exec stream has no line for, and the user's own
    // message, make nothing.
    for quiet in [
        r#"{"method":"thread/status/changed","params":{}}"#,
        r#"{"method":"item/completed","params":{"item":{"type":"userMessage","id":"u1"}}}"#,
        r#"{"jsonrpc":"2.0"}"#,
    ] {
        assert!(client.message(quiet, &asker, &mut answers).is_empty(), "{quiet}");
    }
    assert!(answers.is_empty());
}

#[test]
fn the_command_shown_is_the_script_not_the_shell_wrapper() {
    let one = json!({ "command": "/bin/bash -lc 'ls'", "commandActions": [{ "type": "list", "command": "ls" }] });
    assert_eq!(shown_command(&one), "ls");
    let two = json!({ "command": "/bin/bash -lc 'a; b'", "commandActions": [{ "command": "a" }, { "command": "b" }] });
    assert_eq!(shown_command(&two), "a && b");
    assert_eq!(shown_command(&json!({ "command": "make" })), "make");
}
