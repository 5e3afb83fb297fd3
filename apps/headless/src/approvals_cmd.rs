//! `lemon-gateway approvals`: list the calls waiting for an answer, answer
//! one (`approve`, `deny`), or see which rule of the config a call would hit
//! (`test 'bash: rm -rf build'`, offline).

use std::path::Path;

use lemon_core::approvals::Policy;
use serde_json::{json, Value};

use crate::client::Client;
use crate::failure;

/// The requests waiting, one line each (or their JSON).
// The command's output goes to the terminal.
#[allow(clippy::print_stdout)]
pub async fn list(client: &Client, json: bool) -> anyhow::Result<u8> {
    let answer = client.get("/v1/approvals").await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&answer["approvals"])?);
        return Ok(failure::OK);
    }
    let pending = answer["approvals"].as_array().cloned().unwrap_or_default();
    if pending.is_empty() {
        println!("no call is waiting for an answer");
    }
    for request in pending {
        let text = |key: &str| request[key].as_str().unwrap_or_default().to_owned();
        let outside = request["untrusted"]
            .as_str()
            .map(|source| format!(", untrusted text from {}", one_line(source)))
            .unwrap_or_default();
        println!(
            "{}  {}  {}: {}  (run {}, {}{outside})",
            text("id"),
            text("session_key"),
            text("tool"),
            one_line(&text("subject")),
            text("run_id"),
            text("rule"),
        );
    }
    Ok(failure::OK)
}

/// Answers request `id`.
#[allow(clippy::print_stdout)]
pub async fn decide(client: &Client, id: &str, approve: bool) -> anyhow::Result<u8> {
    let decision = if approve { "approve" } else { "deny" };
    let answer =
        client.post(&format!("/v1/approvals/{id}"), &json!({ "decision": decision })).await?;
    let request: &Value = &answer["approval"];
    let done = if approve { "approved" } else { "denied" };
    println!(
        "{id}: {done} ({}: {})",
        request["tool"].as_str().unwrap_or_default(),
        one_line(request["subject"].as_str().unwrap_or_default())
    );
    Ok(failure::OK)
}

/// Which rule of the config file at `config` a call written `tool: subject`
/// hits, and what it does.
#[allow(clippy::print_stdout)]
pub fn test(config: &Path, call: &str) -> anyhow::Result<u8> {
    let Some((tool, subject)) = call.split_once(':') else {
        anyhow::bail!(
            "write the call as `tool: subject`, e.g. 'bash: rm -rf build' or 'read: /etc/hosts'"
        );
    };
    let loaded = lemon_core::config::load_file_or_default(config)?;
    let approvals = &loaded.config.gateway.approvals;
    let not_a_glob = |(i, key, why): (usize, &str, String)| {
        anyhow::anyhow!("rule {}: {key}: not a glob: {why}", i + 1)
    };
    let owner = Policy::from_config(approvals).map_err(not_a_glob)?;
    let untrusted = Policy::untrusted_from_config(approvals).map_err(not_a_glob)?;
    // The owner's rules first, then what a run of outside text would get.
    for (prefix, policy) in [("", &owner), ("untrusted runs: ", &untrusted)] {
        let verdict = policy.judge(tool.trim(), subject.trim());
        match verdict.rule {
            Some(n) => {
                println!("{prefix}{}: rule {n} ({})", verdict.action.as_str(), verdict.rule_text);
            }
            None => println!("{prefix}{}: no rule matched", verdict.action.as_str()),
        }
    }
    Ok(failure::OK)
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
