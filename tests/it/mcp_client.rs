//! The native engine as an MCP client, end to end through the gateway: a
//! `[[gateway.mcp_servers]]` entry for `@modelcontextprotocol/server-everything`
//! (where `scripts/test` installs it; skipped when missing unless
//! `LEMON_REQUIRE_MCP=1`), the fake LLM asking for `everything__echo`, the
//! answer going back to the model and the run showing the call as an action;
//! a run narrowed by its tool filter is not offered the server's tools.

use std::path::Path;

use lemon_tests::fake_llm::{FakeLlm, FakeToolCall, Turn};
use serde_json::{json, Value};

use crate::support::{everything_server, home_with, Gateway};

const KEY: &str = "sk-test-mcp-client-key";

fn write_key(home: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    std::fs::write(&path, format!("openai_api_key = \"{KEY}\"\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The names of the tools a chat-completions request offers.
fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_owned)).collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_native_run_calls_an_mcp_tool_and_a_narrowed_run_is_not_offered_it() {
    let Some(everything) = everything_server() else { return };
    let llm = FakeLlm::builder().api_key(KEY).start().await;
    let args = json!({ "message": "ping from the model" }).to_string();
    llm.push(Turn::tool_calls(vec![FakeToolCall::new("call_1", "everything__echo", &[&args])]));
    llm.push(Turn::text(&["The server ", "echoed it."]));
    let config = format!(
        "{}\n[gateway.engines.lemon]\nbase_url = \"{}\"\nmodel = \"test-model\"\n\n\
         [[gateway.mcp_servers]]\nname = \"everything\"\ncommand = \"{}\"\nargs = [\"stdio\"]\n\
         tools = [\"echo\", \"get-sum\"]\n",
        crate::support::ALLOW_EVERY_CALL,
        llm.base_url(),
        everything.display()
    );
    let dir = home_with(&config);
    write_key(dir.path());
    let gateway = Gateway::start_in(dir.path()).await;

    let run_id = gateway.submit(json!({ "prompt": "echo something" })).await;
    let events = gateway.events(&run_id).await;
    let completed = events
        .iter()
        .filter(|(kind, _)| kind == "engine_action")
        .map(|(_, data)| data)
        .find(|data| {
            let text = data.to_string();
            text.contains("\"completed\"") && text.contains("everything__echo")
        })
        .unwrap_or_else(|| panic!("a completed everything__echo action: {events:?}"));
    assert!(completed.to_string().contains("\"ok\":true"), "{completed}");
    assert!(completed.to_string().contains("Echo: ping from the model"), "{completed}");
    let run = gateway.run(&run_id).await;
    assert_eq!(run["answer"], "The server echoed it.", "{run}");

    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    let names = offered(&requests[0].body);
    assert!(names.contains(&"bash".to_owned()), "the built-ins beside: {names:?}");
    assert!(names.contains(&"everything__get-sum".to_owned()), "{names:?}");
    assert!(!names.iter().any(|n| n == "everything__get-env"), "the allow list applies: {names:?}");
    let echo = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "everything__echo")
        .expect("everything__echo offered")
        .clone();
    assert_eq!(echo["function"]["parameters"]["type"], "object", "{echo}");
    assert!(echo["function"]["parameters"]["properties"]["message"].is_object(), "{echo}");
    let second = requests[1].body["messages"].to_string();
    assert!(second.contains("Echo: ping from the model"), "the result went back: {second}");

    // The same server, a run whose filter lets only bash through.
    llm.push(Turn::text(&["Only bash here."]));
    let narrowed = json!({ "prompt": "what can you use?", "meta": { "tool_filter": [["bash"]] } });
    let run_id = gateway.submit(narrowed).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "Only bash here.", "{run}");
    let last = llm.requests().last().cloned().expect("a third request");
    assert_eq!(offered(&last.body), ["bash"]);
    gateway.terminate().await;
}
