//! Tests of the serve client's reading of OpenCode's events, in the shapes
//! OpenCode 1.18.33's server sends them.

use super::*;

fn stream() -> Stream {
    let id = "ses_main".to_owned();
    Stream { family: HashSet::from([id.clone()]), id, parser: SseParser::default() }
}

fn part_event(part: Value) -> Value {
    json!({ "type": "message.part.updated", "properties": { "sessionID": part["sessionID"], "part": part } })
}

#[test]
fn the_sessions_parts_read_as_run_lines_once_they_are_final() {
    let mut stream = stream();
    let tool = |status: &str| {
        part_event(
            json!({ "type": "tool", "tool": "bash", "callID": "call_1", "sessionID": "ses_main",
            "state": { "status": status, "input": { "command": "ls" } } }),
        )
    };
    for pending in ["pending", "running"] {
        assert!(matches!(stream.event(&tool(pending)), Step::Nothing), "{pending}");
    }
    let Step::Line(line) = stream.event(&tool("completed")) else { panic!("a tool_use line") };
    assert_eq!(line["type"], "tool_use");
    assert_eq!(line["sessionID"], "ses_main");
    assert_eq!(line["part"]["callID"], "call_1");
    let text = |end: Value| {
        part_event(
            json!({ "type": "text", "sessionID": "ses_main", "text": "Hi", "time": { "start": 1, "end": end } }),
        )
    };
    assert!(matches!(stream.event(&text(Value::Null)), Step::Nothing), "a text still streaming");
    let Step::Line(line) = stream.event(&text(json!(2))) else { panic!("a text line") };
    assert_eq!((line["type"].as_str(), line["part"]["text"].as_str()), (Some("text"), Some("Hi")));
    let step =
        part_event(json!({ "type": "step-finish", "sessionID": "ses_main", "reason": "stop" }));
    let Step::Line(line) = stream.event(&step) else { panic!("a step_finish line") };
    assert_eq!(line["type"], "step_finish");
    // Another session's parts (another run's server would not send them; a
    // subagent's are its own) make nothing.
    let other =
        part_event(json!({ "type": "step-finish", "sessionID": "ses_other", "reason": "stop" }));
    assert!(matches!(stream.event(&other), Step::Nothing));
}

#[test]
fn idle_ends_errors_fail_and_subagents_ask_too() {
    let mut stream = stream();
    let idle = json!({ "type": "session.status", "properties": { "sessionID": "ses_main", "status": { "type": "idle" } } });
    assert!(matches!(stream.event(&idle), Step::Idle));
    let busy = json!({ "type": "session.status", "properties": { "sessionID": "ses_main", "status": { "type": "busy" } } });
    assert!(matches!(stream.event(&busy), Step::Nothing));
    let error = json!({ "type": "session.error", "properties": { "sessionID": "ses_main", "error": { "name": "APIError", "data": { "message": "boom" } } } });
    let Step::Line(line) = stream.event(&error) else { panic!("an error line") };
    assert_eq!(line["type"], "error");
    assert_eq!(line["error"]["data"]["message"], "boom");

    let asked = |session: &str| {
        json!({ "type": "permission.asked", "properties": { "id": "per_1", "sessionID": session, "permission": "bash",
            "patterns": ["touch a"], "metadata": { "command": "touch a" }, "tool": { "callID": "call_1" } } })
    };
    assert!(matches!(stream.event(&asked("ses_sub")), Step::Nothing), "not the run's session");
    let created = json!({ "type": "session.created", "properties": { "info": { "id": "ses_sub", "parentID": "ses_main" } } });
    assert!(matches!(stream.event(&created), Step::Nothing));
    let Step::Ask(request) = stream.event(&asked("ses_sub")) else {
        panic!("a subagent's call is asked")
    };
    assert_eq!(request["id"], "per_1");
}

#[test]
fn permissions_are_judged_as_the_gateways_tools() {
    let ask = |permission: &str, patterns: &[&str], metadata: Value| json!({ "permission": permission, "patterns": patterns, "metadata": metadata });
    let cases = [
        (
            ask("bash", &["touch a", "echo b"], json!({ "command": "touch a && echo b" })),
            ("bash", json!({ "command": "touch a && echo b" })),
        ),
        (
            ask("bash", &["touch a", "echo b"], json!({})),
            ("bash", json!({ "command": "touch a && echo b" })),
        ),
        (
            ask("edit", &["src/main.rs"], json!({ "filepath": "/p/src/main.rs" })),
            ("edit", json!({ "path": "/p/src/main.rs" })),
        ),
        (ask("read", &["notes.md"], json!({})), ("read", json!({ "path": "notes.md" }))),
        (
            ask("webfetch", &["https://example.com/x"], json!({ "url": "https://example.com/x" })),
            ("fetch", json!({ "url": "https://example.com/x" })),
        ),
        (
            ask("external_directory", &["/etc/*"], json!({})),
            ("external_directory", json!({ "patterns": ["/etc/*"] })),
        ),
    ];
    for (asked, (tool, input)) in cases {
        assert_eq!(call_of(&asked), (tool, input), "{asked}");
    }
}
