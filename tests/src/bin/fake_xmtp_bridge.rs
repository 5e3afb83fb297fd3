//! A stand-in for `bridges/xmtp/bridge.mjs`, started by the gateway as its
//! `node` with a control file as its "script": it connects to the test's hub
//! (the address in the file), tells it how it was started (argv, environment),
//! and then relays lines both ways, so the test speaks the bridge protocol.
//! A line `{"fake":"exit","code":N}` from the hub makes it exit with `N` at
//! once, like a bridge that crashes.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(control) = args.get(1) else {
        let _ = writeln!(std::io::stderr(), "fake-xmtp-bridge: no control file");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(control).expect("control file");
    let control: serde_json::Value = serde_json::from_str(&text).expect("control JSON");
    let addr = control["control"].as_str().expect("control address");
    let stream = TcpStream::connect(addr).expect("connect to the hub");
    let mut to_hub = stream.try_clone().expect("clone");
    let env: serde_json::Map<String, serde_json::Value> =
        std::env::vars().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
    let hello = serde_json::json!({
        "fake": "hello",
        "argv": args,
        "env": env,
        "cwd": std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_default(),
        "pid": std::process::id(),
    });
    writeln!(to_hub, "{hello}").expect("hello");

    // Gateway → hub.
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if writeln!(to_hub, "{line}").is_err() {
                break;
            }
        }
        // The gateway closed stdin: a bridge exits.
        std::process::exit(0);
    });

    // Hub → gateway.
    let mut stdout = std::io::stdout();
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) {
            if value["fake"] == "exit" {
                let code = value["code"].as_i64().unwrap_or(1);
                std::process::exit(i32::try_from(code).unwrap_or(1));
            }
        }
        if writeln!(stdout, "{line}").and_then(|()| stdout.flush()).is_err() {
            break;
        }
    }
    std::process::exit(0);
}
