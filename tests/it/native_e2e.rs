//! The native `lemon` engine on the real binary: the default engine with and
//! without a key, and turns streamed from a local OpenAI-compatible server
//! (a bash tool round trip, a session resumed after a restart).

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::support::{home_with, Gateway};

/// A minimal OpenAI Chat Completions server: answers each request with the
/// next scripted turn as SSE and records every request body.
struct ScriptedLlm {
    base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

/// One scripted turn: plain text, or one tool call.
#[derive(Clone)]
enum Reply {
    Text(&'static str),
    Call { name: &'static str, arguments: Value },
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let body = json!({ "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }] });
    format!("data: {body}\n\n")
}

fn sse(reply: &Reply) -> String {
    let mut out = String::new();
    match reply {
        Reply::Text(text) => {
            for word in text.split_inclusive(' ') {
                out.push_str(&chunk(json!({ "content": word }), None));
            }
            out.push_str(&chunk(json!({}), Some("stop")));
        }
        Reply::Call { name, arguments } => {
            let call = json!([{ "index": 0, "id": "call_1", "type": "function",
                "function": { "name": name, "arguments": arguments.to_string() } }]);
            out.push_str(&chunk(json!({ "tool_calls": call }), None));
            out.push_str(&chunk(json!({}), Some("tool_calls")));
        }
    }
    out.push_str(
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":3}}\n\n",
    );
    out.push_str("data: [DONE]\n\n");
    out
}

impl ScriptedLlm {
    async fn start(replies: Vec<Reply>) -> ScriptedLlm {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(std::collections::VecDeque::from(replies)));
        let recorded = requests.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                let (recorded, replies) = (recorded.clone(), replies.clone());
                tokio::spawn(async move {
                    let Some(body) = read_request(&mut socket).await else { return };
                    recorded.lock().unwrap().push(body);
                    let reply = replies
                        .lock()
                        .unwrap()
                        .pop_front()
                        .unwrap_or(Reply::Text("(no more turns)"));
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                    let _ = socket.write_all(format!("{head}{}", sse(&reply)).as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        ScriptedLlm { base_url, requests }
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// The JSON body of one HTTP/1.1 request.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Value> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + length {
            return serde_json::from_slice(&buf[end + 4..end + 4 + length]).ok();
        }
    }
}

fn lemon_config(base_url: &str) -> String {
    format!("[gateway.engines.lemon]\nbase_url = \"{base_url}\"\nmodel = \"test-model\"\n")
}

fn write_key(home: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let path = home.join("secrets.toml");
    std::fs::write(&path, "openai_api_key = \"sk-test-native-key\"\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn engine_status(status: &Value, id: &str) -> Value {
    status["engines"].as_array().unwrap().iter().find(|e| e["id"] == id).unwrap().clone()
}

#[tokio::test]
async fn without_a_key_the_default_engine_is_echo_and_the_status_says_why() {
    let gateway = Gateway::start("").await;
    let status = gateway.status().await;
    assert_eq!(status["default_engine"], "echo", "{status}");
    assert_eq!(status["default_engine_reason"], "no openai_api_key set", "{status}");
    let lemon = engine_status(&status, "lemon");
    assert_eq!(lemon["available"], false, "{lemon}");
    let reason = lemon["reason"].as_str().unwrap();
    assert!(reason.contains("openai_api_key") && reason.contains("OPENAI_API_KEY"), "{reason}");
    // The first message of a newcomer still answers.
    let run_id = gateway.submit(json!({ "prompt": "hello there" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["resume"]["engine"], "echo", "{run}");
    assert_eq!(run["answer"], "hello there", "{run}");
    gateway.terminate().await;
}

#[tokio::test]
async fn with_a_key_lemon_is_the_default_and_streams_a_bash_round_trip() {
    let workdir = tempfile::tempdir().unwrap();
    let llm = ScriptedLlm::start(vec![
        Reply::Call {
            name: "bash",
            arguments: json!({ "command": "echo changed > note.txt && cat note.txt" }),
        },
        Reply::Text("The file now says changed."),
    ])
    .await;
    let dir = home_with(&lemon_config(&llm.base_url));
    write_key(dir.path());
    let gateway = Gateway::start_in(dir.path()).await;
    let status = gateway.status().await;
    assert_eq!(status["default_engine"], "lemon", "{status}");
    assert_eq!(status["default_engine_reason"], "openai_api_key is set", "{status}");
    assert_eq!(engine_status(&status, "lemon")["available"], true);

    let cwd = workdir.path().to_str().unwrap();
    let run_id = gateway.submit(json!({ "prompt": "change the note", "cwd": cwd })).await;
    let events = gateway.events(&run_id).await;
    let deltas: String = events
        .iter()
        .filter(|(kind, _)| kind == "delta")
        .filter_map(|(_, data)| data["text"].as_str())
        .collect();
    assert_eq!(deltas, "The file now says changed.", "{events:?}");
    let actions: Vec<&Value> =
        events.iter().filter(|(k, _)| k == "engine_action").map(|(_, d)| d).collect();
    assert!(
        actions
            .iter()
            .any(|a| a.to_string().contains("completed") && a.to_string().contains("bash")),
        "{actions:?}"
    );
    assert_eq!(std::fs::read_to_string(workdir.path().join("note.txt")).unwrap(), "changed\n");
    let run = gateway.run(&run_id).await;
    assert_eq!(run["resume"]["engine"], "lemon", "{run}");
    assert_eq!(run["answer"], "The file now says changed.", "{run}");
    let requests = llm.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["model"], "test-model");
    let second = requests[1]["messages"].to_string();
    assert!(second.contains("changed"), "the tool's output went back: {second}");
    assert!(!format!("{events:?}{run}").contains("sk-test-native-key"));
    gateway.terminate().await;
}

#[tokio::test]
async fn a_lemon_session_resumes_after_a_restart() {
    let llm =
        ScriptedLlm::start(vec![Reply::Text("first answer"), Reply::Text("second answer")]).await;
    let dir = home_with(&lemon_config(&llm.base_url));
    write_key(dir.path());
    let gateway = Gateway::start_in(dir.path()).await;
    let run_id = gateway.submit(json!({ "prompt": "remember lemons", "engine": "lemon" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "first answer", "{run}");
    let token = run["resume"]["value"]
        .as_str()
        .unwrap_or_else(|| panic!("a resume token: {run}"))
        .to_owned();
    gateway.terminate().await;

    let gateway = Gateway::start_in(dir.path()).await;
    let prompt = format!("lemon resume {token}\nwhat did I say?");
    let run_id = gateway.submit(json!({ "prompt": prompt, "session_key": "another" })).await;
    let run = gateway.wait(&run_id).await;
    assert_eq!(run["answer"], "second answer", "{run}");
    let second = llm.requests()[1]["messages"].to_string();
    assert!(second.contains("remember lemons") && second.contains("first answer"), "{second}");
    gateway.terminate().await;
}
