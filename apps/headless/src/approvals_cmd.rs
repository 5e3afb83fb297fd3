//! `lemon-gateway approvals`: list the calls waiting for an answer, answer
//! one (`approve`, `deny`), or see which rule of the config a call would hit
//! (`test 'bash: rm -rf build'`, offline).

use std::path::Path;

use lemon_core::approvals::{Rules, RunScope};
use serde_json::{json, Value};

use crate::client::Client;
use crate::failure;

/// The requests waiting, one line each (or their JSON).
// The command's output goes to the terminal.
#[allow(clippy::print_stdout)]
pub async fn list(client: &Client, json: bool) -> anyhow::Result<u8> {
    let answer = client.get("/v1/approvals").await?;
    if json {
        crate::say!("{}", serde_json::to_string_pretty(&answer["approvals"])?);
        return Ok(failure::OK);
    }
    let pending = answer["approvals"].as_array().cloned().unwrap_or_default();
    if pending.is_empty() {
        crate::say!("no call is waiting for an answer");
    }
    for request in pending {
        let text = |key: &str| request[key].as_str().unwrap_or_default().to_owned();
        let outside = request["untrusted"]
            .as_str()
            .map(|source| format!(", untrusted text from {}", one_line(source)))
            .unwrap_or_default();
        crate::say!(
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
    crate::say!(
        "{id}: {done} ({}: {})",
        request["tool"].as_str().unwrap_or_default(),
        one_line(request["subject"].as_str().unwrap_or_default())
    );
    Ok(failure::OK)
}

/// Which rule of the config file at `config` a call written `tool: subject`
/// hits on `engine`, in `cwd`, from `chat` (`transport:chat_id[:topic_id]`),
/// and what it does; then the same for an untrusted run.
#[allow(clippy::print_stdout)]
pub fn test(
    config: &Path,
    call: &str,
    engine: &str,
    cwd: Option<&Path>,
    chat: Option<&str>,
) -> anyhow::Result<u8> {
    let Some((tool, subject)) = call.split_once(':') else {
        anyhow::bail!(
            "write the call as `tool: subject`, e.g. 'bash: rm -rf build' or 'read: /etc/hosts'"
        );
    };
    let loaded = lemon_core::config::load_file_or_default(config)?;
    let rules = Rules::from_gateway(&loaded.config.gateway)
        .map_err(|(i, key, why)| anyhow::anyhow!("rule {}: {key}: not a glob: {why}", i + 1))?;
    let mut meta = std::collections::BTreeMap::new();
    if let Some(chat) = chat {
        let mut parts = chat.splitn(3, ':');
        let (Some(transport), Some(chat_id)) = (parts.next(), parts.next()) else {
            anyhow::bail!("write the chat as `transport:chat_id[:topic_id]`, e.g. telegram:42");
        };
        let channel = lemon_core::router::ChannelRef {
            transport: transport.to_owned(),
            chat_id: Some(chat_id.to_owned()),
            topic_id: parts.next().map(str::to_owned),
        };
        meta.insert("channel".to_owned(), channel.to_meta());
    }
    let cwd = cwd.unwrap_or(Path::new("/"));
    // The owner's rules first, then what a run of outside text would get.
    for (prefix, untrusted) in [("", false), ("untrusted runs: ", true)] {
        let scope = RunScope { untrusted, engine, cwd, meta: &meta };
        let verdict = rules.for_scope(&scope).judge(tool.trim(), subject.trim());
        match verdict.rule {
            Some(n) => {
                crate::say!(
                    "{prefix}{}: rule {n} ({})",
                    verdict.action.as_str(),
                    verdict.rule_text
                );
            }
            None => crate::say!("{prefix}{}: no rule matched", verdict.action.as_str()),
        }
    }
    Ok(failure::OK)
}

/// What `config check` says of the approval rules: how many apply to your
/// runs and to untrusted ones, and which scopes add rules before them.
pub fn summary(gateway: &lemon_core::config::GatewayConfig) -> String {
    let approvals = &gateway.approvals;
    let count = |rules: &[lemon_core::config::ApprovalRuleConfig], configured: bool| {
        let n = rules.len();
        let whose = if configured { "" } else { " (the defaults)" };
        format!("{n} rule{}{whose}", if n == 1 { "" } else { "s" })
    };
    let mut scopes: Vec<String> = Vec::new();
    for (engine, rules) in &approvals.engines {
        if !rules.is_empty() {
            scopes.push(format!("engine {engine}"));
        }
    }
    for (id, project) in &gateway.projects {
        if !project.approvals.is_empty() {
            scopes.push(format!("project {id:?}"));
        }
    }
    for binding in gateway.bindings.iter().filter(|b| !b.approvals.is_empty()) {
        scopes.push(format!(
            "binding {}:{}",
            binding.transport,
            binding.chat_id_text().unwrap_or_default()
        ));
    }
    let mut line = format!(
        "approvals: {} for your runs, {} for untrusted runs",
        count(&approvals.owner_rules(), approvals.rules.is_some()),
        count(&approvals.untrusted_rules(), approvals.untrusted.is_some()),
    );
    if !scopes.is_empty() {
        line.push_str(&format!("; tried first: {}", scopes.join(", ")));
    }
    line.push_str(
        "\n  see which rule a call hits: lemon-gateway approvals test 'bash: rm -rf build'",
    );
    line
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
