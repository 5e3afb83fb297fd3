//! `status`, `engines`, `runs` and `logs`: a running gateway's state for people
//! (short aligned text) or for scripts (`--json`).

use serde_json::Value;

use crate::client::Client;
use crate::failure;
use crate::progress::{flat, one_line};
use crate::style::Style;

/// `1h 2m`, `5m 3s`, `42s`, `350ms`.
pub fn duration(ms: u64) -> String {
    let secs = ms / 1000;
    match secs {
        0 => format!("{ms}ms"),
        1..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m {}s", secs / 60, secs % 60),
        3600..=86_399 => format!("{}h {}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d {}h", secs / 86_400, secs % 86_400 / 3600),
    }
}

fn engine_line(engine: &Value, style: Style) -> String {
    let id = engine["id"].as_str().unwrap_or("?");
    if engine["available"] == true {
        format!("{id:<12} {}", style.green("available"))
    } else {
        let reason = flat(engine["reason"].as_str().unwrap_or("unavailable"));
        format!("{id:<12} {}", style.red(&format!("unavailable: {reason}")))
    }
}

/// Bytes in B, kB, MB, GB or TB (powers of 1000), one decimal past B.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["kB", "MB", "GB", "TB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    #[allow(clippy::cast_precision_loss)]
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The human summary of `/v1/status`.
pub fn status_text(status: &Value, url: &str, style: Style) -> String {
    let mut out = Vec::new();
    let uptime = duration(status["uptime_ms"].as_u64().unwrap_or(0));
    let version = status["version"].as_str().unwrap_or("?");
    out.push(format!("gateway   {url}, up {uptime} (version {version})"));
    let scheduler = &status["scheduler"];
    let num = |key: &str| scheduler[key].as_u64().unwrap_or(0);
    out.push(format!(
        "slots     {} of {} in use, {} queued",
        num("in_flight"),
        num("max"),
        num("queued")
    ));
    if let Some(store) = status["store"].as_object() {
        let bytes = |key: &str| store.get(key).and_then(Value::as_u64).map(size);
        let path = store.get("path").and_then(Value::as_str).unwrap_or("?");
        let total = bytes("bytes").unwrap_or_else(|| "size unknown".to_owned());
        out.push(match bytes("log_bytes") {
            Some(log) => format!("store     {total} (log {log}) at {path}"),
            None => format!("store     {total} at {path}"),
        });
        out.extend(store_upkeep_lines(store).into_iter().map(|line| format!("          {line}")));
    }
    if let Some(cluster) = status["cluster"].as_object() {
        out.push(format!("cluster   {}", cluster_line(cluster, style)));
    }
    let default = status["default_engine"].as_str().unwrap_or("");
    for (i, engine) in status["engines"].as_array().into_iter().flatten().enumerate() {
        let label = if i == 0 { "engines" } else { "" };
        let mut line = format!("{label:<9} {}", engine_line(engine, style));
        if engine["id"] == default {
            line.push_str(" (default)");
        }
        out.push(line);
    }
    let transports = status["transports"].as_object();
    if transports.is_none_or(|t| t.is_empty()) {
        out.push("channels  none".to_owned());
    }
    for (i, (id, transport)) in transports.into_iter().flatten().enumerate() {
        let label = if i == 0 { "channels" } else { "" };
        let state = transport["state"].as_str().unwrap_or("?");
        let painted = match state {
            "running" => style.green(state),
            "failing" | "stopped" => style.red(state),
            "disabled" => style.dim(state),
            _ => style.yellow(state),
        };
        let mut line = format!("{label:<9} {id:<12} {painted}");
        for key in ["detail", "reason"] {
            if let Some(text) = transport[key].as_str() {
                line.push_str(&format!(": {}", flat(text)));
            }
        }
        out.push(line);
    }
    out.join("\n")
}

/// A cluster node's line: this node, the nodes alive, the cluster's slots, the
/// sessions here and the channels this node owns.
fn cluster_line(cluster: &serde_json::Map<String, Value>, style: Style) -> String {
    let node = cluster.get("node").and_then(Value::as_str).unwrap_or("?");
    let mut line = format!("node {node}");
    if cluster.get("fenced").and_then(Value::as_bool) == Some(true) {
        line.push_str(&format!(" {}", style.red("fenced")));
    }
    if let Some(nodes) = cluster.get("nodes").and_then(Value::as_array) {
        let alive = nodes.iter().filter(|n| n["alive"] == true).count();
        line.push_str(&format!(", {alive} of {} nodes alive", nodes.len()));
    }
    if let Some(slots) = cluster.get("slots") {
        let num = |key: &str| slots[key].as_u64().unwrap_or(0);
        line.push_str(&format!(", {} of {} cluster slots in use", num("in_use"), num("total")));
    }
    let here = cluster.get("sessions_here").and_then(Value::as_u64).unwrap_or(0);
    line.push_str(&format!(", sessions here: {here}"));
    let owned: Vec<&str> = cluster
        .get("channels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| c["live"] == true && c["node"].as_str() == Some(node))
        .filter_map(|c| c["channel"].as_str())
        .collect();
    if !owned.is_empty() {
        line.push_str(&format!(", owns {}", owned.join(" ")));
    }
    if let Some(error) = cluster.get("error").and_then(Value::as_str) {
        line.push_str(&format!(" ({})", flat(error)));
    }
    line
}

/// Where a folded line of `status` goes on: under the values, past the labels.
const STATUS_INDENT: usize = 10;
/// Where a folded line of `engines` goes on: under the state, past the id.
const ENGINES_INDENT: usize = 13;

/// The width of the terminal stdout is (`COLUMNS` when set), or `None` when
/// stdout is not a terminal: a pipe or a file gets whole lines.
pub fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return None;
    }
    let columns = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse::<usize>().ok());
    columns
        .or_else(|| rustix::termios::tcgetwinsize(&stdout).ok().map(|size| size.ws_col.into()))
        .filter(|width| *width > 0)
}

/// `line` as it fits `width` columns: folded at spaces, each folded part
/// indented by `indent`; whole when there is no width.
pub fn fit(line: &str, width: Option<usize>, indent: usize) -> String {
    match width {
        Some(width) => wrap(line, width, indent),
        None => line.to_owned(),
    }
}

/// `line` folded at spaces into lines of at most `width` visible columns
/// (colour escapes take none), the folded parts after `indent` spaces. A
/// word longer than the room is left whole for the terminal to fold.
pub fn wrap(line: &str, width: usize, indent: usize) -> String {
    // Narrower than this, folding under the values helps no one.
    let width = width.max(indent + 20);
    let mut out = String::with_capacity(line.len());
    let mut column = 0;
    for (i, word) in line.split(' ').enumerate() {
        let len = visible_len(word);
        if i > 0 {
            if column + 1 + len > width && column > indent && len > 0 {
                out.push('\n');
                out.push_str(&" ".repeat(indent));
                column = indent;
            } else {
                out.push(' ');
                column += 1;
            }
        }
        out.push_str(word);
        column += len;
    }
    out
}

/// The columns `text` takes on a terminal: its characters but for the
/// colour escapes (`ESC [ … m`).
fn visible_len(text: &str) -> usize {
    let mut len = 0;
    let mut in_escape = false;
    for c in text.chars() {
        match (in_escape, c) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, _) => len += 1,
        }
    }
    len
}

/// `status [--json]`.
///
/// # Errors
/// The gateway unreachable or refusing.
#[allow(clippy::print_stdout)] // The command's own output.
pub async fn status(client: &Client, json: bool, style: Style) -> anyhow::Result<u8> {
    let mut status = client.get("/v1/status").await?;
    // The config's state: an edit refused, settings waiting for a restart.
    let config = client.get("/v1/config").await.unwrap_or(Value::Null);
    let edits = serde_json::json!({
        "rejected": config["rejected"],
        "pending_restart": config["pending_restart"],
    });
    if json {
        status["config"] = edits;
        crate::say!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        let text = status_text(&status, client.url(), style);
        let width = terminal_width();
        for line in text.lines().map(ToOwned::to_owned).chain(config_lines(&edits)) {
            crate::say!("{}", fit(&line, width, STATUS_INDENT));
        }
    }
    Ok(failure::OK)
}

/// What `status` says of the config file: an edit the gateway refused (it
/// runs on its last good config) and settings that wait for a restart.
pub fn config_lines(edits: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(error) = edits["rejected"]["error"].as_str() {
        lines.push(format!(
            "config    edit refused at {}, the last good config runs: {}",
            utc_minute(edits["rejected"]["at_ms"].as_i64()),
            flat(error)
        ));
    }
    let pending: Vec<&str> = edits["pending_restart"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["key"].as_str())
        .collect();
    if !pending.is_empty() {
        let label = if lines.is_empty() { "config" } else { "" };
        lines.push(format!("{label:<9} waits for a restart: {}", pending.join(", ")));
    }
    lines
}

/// `engines [--json]`: each engine with its availability (or why not).
///
/// # Errors
/// The gateway unreachable or refusing.
#[allow(clippy::print_stdout)] // The command's own output.
pub async fn engines(client: &Client, json: bool, style: Style) -> anyhow::Result<u8> {
    let status = client.get("/v1/status").await?;
    if json {
        crate::say!("{}", serde_json::to_string_pretty(&status["engines"])?);
        return Ok(failure::OK);
    }
    let default = status["default_engine"].as_str().unwrap_or("");
    let width = terminal_width();
    for engine in status["engines"].as_array().into_iter().flatten() {
        let mut line = engine_line(engine, style);
        if engine["steer"] == true {
            line.push_str(", steers");
        }
        if engine["id"] == default {
            line.push_str(" (default)");
        }
        if let Some(version) = engine["version"].as_str() {
            line.push_str(&format!("  {}", one_line(version)));
        }
        if let Some(path) = engine["path"].as_str() {
            line.push_str(&format!("  {}", style.dim(path)));
        }
        crate::say!("{}", fit(&line, width, ENGINES_INDENT));
    }
    Ok(failure::OK)
}

/// One line of `runs`.
pub fn run_line(run: &Value, style: Style) -> String {
    let status = run["status"].as_str().unwrap_or("?");
    let painted = match status {
        "completed" => style.green(status),
        "failed" => style.red(status),
        _ => style.yellow(status),
    };
    // Padded before painting, so colours do not shift the columns.
    let pad = " ".repeat(10usize.saturating_sub(status.len()));
    let took = run["duration_ms"].as_u64().map(duration).unwrap_or_default();
    let prompt = one_line(run["prompt"].as_str().unwrap_or_default());
    let prompt: String = prompt.chars().take(60).collect();
    // A run of outside text says so before its prompt.
    let prompt = match run["untrusted"].as_str() {
        Some(_) => format!("{} {prompt}", style.yellow("[untrusted]")),
        None => prompt,
    };
    let when = run["created_at_ms"].as_u64().map(|at| ago(now_ms().saturating_sub(at)));
    format!(
        "{:<44} {painted}{pad} {:<12} {:>8} {took:>7}  {prompt}",
        run["run_id"].as_str().unwrap_or("?"),
        run["engine"].as_str().unwrap_or("?"),
        when.unwrap_or_default(),
    )
}

/// The head of the `runs` table, aligned with [`run_line`].
pub fn runs_header() -> String {
    format!("{:<44} {:<10} {:<12} {:>8} {:>7}  PROMPT", "RUN", "STATUS", "ENGINE", "WHEN", "TOOK")
}

/// How long ago, in the largest unit: `12s ago`, `5m ago`, `3h ago`, `2d ago`.
pub fn ago(ms: u64) -> String {
    let secs = ms / 1000;
    match secs {
        0..=59 => format!("{secs}s ago"),
        60..=3599 => format!("{}m ago", secs / 60),
        3600..=86_399 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

/// How many of the latest runs a short id is looked for in.
const RECENT_RUNS: usize = 500;

/// The run `given` names: `last` (the newest run), its whole id, or the start
/// of one (`run_0193…`, or without `run_`) that only one of the latest
/// 500 runs has.
///
/// # Errors
/// The gateway unreachable, no run named so (exit 1), or several (usage).
pub async fn resolve_run(client: &Client, given: &str) -> anyhow::Result<String> {
    let given = given.trim();
    if given == "last" {
        let newest = client.get("/v1/runs?limit=1").await?;
        return newest["runs"][0]["run_id"].as_str().map(ToOwned::to_owned).ok_or_else(|| {
            failure::Failure::usage("there is no run yet: `last` names the newest run").into()
        });
    }
    match client.get(&format!("/v1/runs/{}", form_value(given))).await {
        Ok(_) => return Ok(given.to_owned()),
        Err(crate::client::ClientError::Refused { status: 404, .. }) => {}
        Err(error) => return Err(error.into()),
    }
    let recent = client.get(&format!("/v1/runs?limit={RECENT_RUNS}")).await?;
    let ids: Vec<&str> = recent["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|run| run["run_id"].as_str())
        .filter(|id| {
            id.starts_with(given)
                || id.strip_prefix("run_").is_some_and(|rest| rest.starts_with(given))
        })
        .collect();
    match ids[..] {
        [id] => Ok(id.to_owned()),
        [] => Err(failure::Failure::run(format!(
            "run {} not found: give its id, the start of it, or `last` (see `lemon-gateway runs`)",
            one_line(given)
        ))
        .into()),
        _ => Err(failure::Failure::usage(format!(
            "{:?} starts {} runs' ids ({}, …): give more of it",
            one_line(given),
            ids.len(),
            ids[..2].join(", ")
        ))
        .into()),
    }
}

/// `runs [--status S] [--limit N] [--json]`, newest first.
///
/// # Errors
/// The gateway unreachable or refusing (a bad status).
#[allow(clippy::print_stdout, clippy::print_stderr)] // The command's own output.
pub async fn runs(
    client: &Client,
    status: Option<&str>,
    limit: Option<usize>,
    json: bool,
    style: Style,
) -> anyhow::Result<u8> {
    let mut query = Vec::new();
    if let Some(status) = status {
        query.push(format!("status={}", form_value(status)));
    }
    if let Some(limit) = limit {
        query.push(format!("limit={limit}"));
    }
    let path = if query.is_empty() {
        "/v1/runs".to_owned()
    } else {
        format!("/v1/runs?{}", query.join("&"))
    };
    let answer = client.get(&path).await?;
    if json {
        crate::say!("{}", serde_json::to_string_pretty(&answer["runs"])?);
        return Ok(failure::OK);
    }
    let runs = answer["runs"].as_array().map(Vec::as_slice).unwrap_or_default();
    if runs.is_empty() {
        match status {
            Some(status) => eprintln!("no {} runs", one_line(status)),
            None => eprintln!("no runs yet: `lemon-gateway run \"…\"` starts one"),
        }
        return Ok(failure::OK);
    }
    crate::say!("{}", style.dim(&runs_header()));
    for run in runs {
        crate::say!("{}", run_line(run, style));
    }
    Ok(failure::OK)
}

/// A query value or path segment with everything but unreserved characters
/// percent-encoded.
pub fn form_value(raw: &str) -> String {
    raw.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// One event as a line of `logs`.
pub fn event_line(kind: &str, data: &Value) -> String {
    let index = data["index"].as_u64().unwrap_or(0);
    let detail = match kind {
        "run_started" => format!("engine {}", data["engine"].as_str().unwrap_or("?")),
        "engine_action" => {
            let action = &data["action"];
            let line = format!(
                "{} {}: {}",
                action["phase"].as_str().unwrap_or("?"),
                action["kind"].as_str().unwrap_or("?"),
                one_line(action["title"].as_str().unwrap_or_default())
            );
            // An approval's line says what is asked, then who decided.
            match action["message"].as_str().filter(|_| action["kind"] == "approval") {
                Some(message) => format!("{line} ({})", one_line(message)),
                None => line,
            }
        }
        "delta" => one_line(data["text"].as_str().unwrap_or_default()),
        "run_completed" => {
            let status = data["status"].as_str().unwrap_or("?");
            match data["error"].as_str() {
                Some(error) => format!("{status}: {}", one_line(error)),
                None => status.to_owned(),
            }
        }
        "run_phase" => data["phase"].as_str().unwrap_or_default().to_owned(),
        _ => String::new(),
    };
    format!("{index:>4} {kind:<17} {detail}").trim_end().to_owned()
}

/// A time in UTC to the minute: `2026-12-06 03:00 UTC`.
fn utc_minute(at_ms: Option<i64>) -> String {
    at_ms
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or_else(|| "?".to_owned(), |at| at.format("%Y-%m-%d %H:%M UTC").to_string())
}

/// The store's rows, its last retention pass and its last backup, as
/// `status` shows them under its size.
fn store_upkeep_lines(store: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(rows) = store.get("rows").and_then(Value::as_object) {
        let rows: Vec<String> =
            rows.iter().map(|(table, n)| format!("{table} {}", n.as_u64().unwrap_or(0))).collect();
        lines.push(format!("rows: {}", rows.join(", ")));
    }
    match store.get("last_prune").filter(|pass| !pass.is_null()) {
        Some(pass) => {
            let removed: Vec<String> = pass["removed"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(kind, n)| format!("{} {kind}", n.as_u64().unwrap_or(0)))
                .collect();
            let what = if removed.is_empty() {
                "nothing to remove".to_owned()
            } else {
                removed.join(", ")
            };
            let mut line = format!("last prune {}: {what}", utc_minute(pass["at_ms"].as_i64()));
            if let Some(error) = pass["error"].as_str() {
                line.push_str(&format!(" (stopped: {})", one_line(error)));
            }
            lines.push(line);
        }
        None => lines.push("last prune: none yet".to_owned()),
    }
    match store.get("last_backup").filter(|backup| !backup.is_null()) {
        Some(backup) => lines.push(format!(
            "last backup {} at {}",
            utc_minute(backup["at_ms"].as_i64()),
            backup["path"].as_str().unwrap_or("?")
        )),
        None => lines.push("last backup: none ([gateway.backup] schedules them)".to_owned()),
    }
    if let Some(error) = store.get("backup_error").and_then(Value::as_str) {
        lines.push(format!("backup failing: {}", one_line(error)));
    }
    lines
}

/// What `logs` prints in place of a run's compacted events: that they were
/// compacted, how many there were, and the actions the run's record kept.
pub fn compacted_lines(compacted: &Value) -> Vec<String> {
    let events = compacted["events"].as_u64().unwrap_or(0);
    let when = utc_minute(compacted["at_ms"].as_i64());
    let mut lines = vec![format!(
        "   … {events} events were compacted on {when} ([gateway.retention] events_days); \
         the run keeps its answer, error and actions:"
    )];
    for action in compacted["actions"].as_array().into_iter().flatten() {
        let mark = if action["ok"] == false { "✗" } else { "✓" };
        lines.push(format!(
            "     {mark} {}: {}",
            action["kind"].as_str().unwrap_or("action"),
            one_line(action["title"].as_str().unwrap_or_default())
        ));
    }
    lines
}

/// `logs RUN [--json]`: the run's events, following a live run to its end. A
/// run whose events were compacted shows what its record kept, then its end.
///
/// # Errors
/// The gateway unreachable, the run unknown, the connection lost.
#[allow(clippy::print_stdout)] // The command's own output.
pub async fn logs(client: &Client, run_id: &str, json: bool) -> anyhow::Result<u8> {
    let mut events = client.events(run_id).await?;
    while let Some((kind, data)) = events.next().await? {
        if json {
            crate::say!("{}", serde_json::to_string(&data)?);
        } else {
            if data.get("compacted").is_some_and(|c| !c.is_null()) {
                let run = client.get(&format!("/v1/runs/{}", form_value(run_id))).await?;
                for line in compacted_lines(&run["compacted"]) {
                    crate::say!("{line}");
                }
            }
            crate::say!("{}", event_line(&kind, &data));
        }
        if kind == "run_completed" {
            return Ok(failure::OK);
        }
    }
    Err(crate::client::ClientError::Lost {
        url: client.url().to_owned(),
        run_id: run_id.to_owned(),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_long_line_folds_at_spaces_under_its_value_and_keeps_every_word() {
        let line = "engines   claude       unavailable: claude not found on PATH \
                    (looked in /opt/a/bin:/opt/b/bin:/usr/local/bin:/usr/bin); set cli_path";
        let folded = wrap(line, 40, 10);
        assert!(folded.lines().count() > 2, "{folded}");
        for part in folded.lines() {
            let one_word = !part.trim().contains(' ');
            assert!(part.chars().count() <= 40 || one_word, "{part:?} in\n{folded}");
        }
        assert!(folded.lines().skip(1).all(|l| l.starts_with(&" ".repeat(10))), "{folded}");
        assert_eq!(flat(&folded), flat(line), "no word lost");
        assert!(flat(&folded).ends_with("set cli_path"));
        assert_eq!(fit(line, None, 10), line, "off a terminal lines stay whole");
    }

    #[test]
    fn colour_escapes_take_no_room() {
        assert_eq!(visible_len("\x1b[31munavailable:\x1b[0m"), "unavailable:".len());
        let painted = format!("engines   \x1b[31m{}\x1b[0m", "word ".repeat(12).trim_end());
        assert!(wrap(&painted, 30, 10).lines().all(|l| visible_len(l) <= 30));
    }

    #[test]
    fn runs_say_how_long_ago_in_the_largest_unit() {
        assert_eq!(ago(12_000), "12s ago");
        assert_eq!(ago(5 * 60_000 + 59_000), "5m ago");
        assert_eq!(ago(3 * 3_600_000), "3h ago");
        assert_eq!(ago(50 * 3_600_000), "2d ago");
        let header = runs_header();
        let line = run_line(
            &json!({"run_id": "run_1", "status": "completed", "engine": "echo",
                    "duration_ms": 1500, "prompt": "hello", "created_at_ms": now_ms() - 300_000}),
            Style { color: false },
        );
        assert_eq!(header.find("PROMPT"), line.find("hello"), "{header}\n{line}");
        assert_eq!(header.find("STATUS"), line.find("completed"), "{header}\n{line}");
        assert_eq!(header.find("WHEN").map(|at| at + 4), line.find(" ago").map(|at| at + 4));
    }

    #[test]
    fn compacted_events_say_so_and_list_the_kept_actions() {
        let compacted = json!({
            "at_ms": 1_780_000_000_000_i64,
            "events": 42,
            "actions": [
                {"kind": "command", "title": "cargo test", "ok": true, "message": null},
                {"kind": "file_change", "title": "src/lib.rs", "ok": false, "message": "denied"}
            ]
        });
        assert_eq!(
            compacted_lines(&compacted),
            [
                "   … 42 events were compacted on 2026-05-28 20:26 UTC ([gateway.retention] events_days); the run keeps its answer, error and actions:",
                "     ✓ command: cargo test",
                "     ✗ file_change: src/lib.rs",
            ]
        );
    }

    #[test]
    fn status_says_when_an_edit_was_refused_and_what_waits_for_a_restart() {
        let edits = json!({
            "rejected": {"error": "config.toml:3:9: gateway.max_concurrent_runs: invalid type", "at_ms": 1_780_000_000_000_i64},
            "pending_restart": [{"key": "gateway.api.port"}, {"key": "gateway.sandbox.mode"}]
        });
        assert_eq!(
            config_lines(&edits),
            [
                "config    edit refused at 2026-05-28 20:26 UTC, the last good config runs: config.toml:3:9: gateway.max_concurrent_runs: invalid type",
                "          waits for a restart: gateway.api.port, gateway.sandbox.mode",
            ]
        );
        assert!(config_lines(&json!({"rejected": null, "pending_restart": []})).is_empty());
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(350), "350ms");
        assert_eq!(duration(42_000), "42s");
        assert_eq!(duration(303_000), "5m 3s");
        assert_eq!(duration(3_720_000), "1h 2m");
        assert_eq!(duration(90_000_000), "1d 1h");
    }

    #[test]
    fn the_status_summary_has_one_line_per_engine_and_channel() {
        let status = json!({
            "version": "0.1.0", "uptime_ms": 65_000,
            "scheduler": {"in_flight": 1, "max": 4, "queued": 2},
            "engines": [
                {"id": "echo", "available": true},
                {"id": "claude", "available": false, "reason": "claude not found\non PATH"}
            ],
            "default_engine": "echo",
            "transports": {"webhook": {"state": "running"}, "telegram": {"state": "failing", "reason": "401"}},
            "store": {
                "path": "/home/me/.lemon/lemon.db", "bytes": 48_213_504, "log_bytes": 1_048_576,
                "rows": {"runs": 4210, "run_events": 31_022},
                "last_prune": {"at_ms": 1_780_000_000_000_i64, "took_ms": 40, "removed": {"runs": 12, "events": 300}, "error": null},
                "last_backup": null
            }
        });
        let text = status_text(&status, "http://127.0.0.1:4040", Style { color: false });
        assert_eq!(
            text,
            "gateway   http://127.0.0.1:4040, up 1m 5s (version 0.1.0)\n\
             slots     1 of 4 in use, 2 queued\n\
             store     48.2 MB (log 1.0 MB) at /home/me/.lemon/lemon.db\n\
             \x20         rows: run_events 31022, runs 4210\n\
             \x20         last prune 2026-05-28 20:26 UTC: 300 events, 12 runs\n\
             \x20         last backup: none ([gateway.backup] schedules them)\n\
             engines   echo         available (default)\n\
             \x20         claude       unavailable: claude not found on PATH\n\
             channels  telegram     failing: 401\n\
             \x20         webhook      running"
        );
    }

    #[test]
    fn a_postgres_store_shows_its_database_and_no_log() {
        let status = json!({
            "version": "0.1.0", "uptime_ms": 1_000,
            "scheduler": {"in_flight": 0, "max": 2, "queued": 0},
            "store": {
                "backend": "postgres", "path": "postgres://db.internal:5432/lemon",
                "bytes": 2_400_000, "log_bytes": null, "rows": null, "last_backup": null
            }
        });
        let text = status_text(&status, "http://127.0.0.1:4040", Style { color: false });
        let line = text.lines().find(|line| line.starts_with("store")).unwrap();
        assert_eq!(line, "store     2.4 MB at postgres://db.internal:5432/lemon");
    }

    #[test]
    fn a_cluster_node_shows_the_cluster_in_one_line() {
        let status = json!({
            "version": "0.1.0", "uptime_ms": 1_000,
            "scheduler": {"in_flight": 0, "max": 2, "queued": 0},
            "cluster": {
                "node": "node-a", "term_ms": 10_000, "fenced": false,
                "nodes": [
                    {"id": "node-a", "alive": true}, {"id": "node-b", "alive": true},
                    {"id": "node-c", "alive": false}
                ],
                "slots": {"total": 8, "in_use": 3},
                "channels": [
                    {"channel": "telegram:mybot", "node": "node-a", "epoch": 2, "live": true},
                    {"channel": "discord:42", "node": "node-b", "epoch": 1, "live": true}
                ],
                "sessions_here": 5
            }
        });
        let text = status_text(&status, "http://127.0.0.1:4040", Style { color: false });
        let line = text.lines().find(|line| line.starts_with("cluster")).unwrap();
        assert_eq!(
            line,
            "cluster   node node-a, 2 of 3 nodes alive, 3 of 8 cluster slots in use, sessions here: 5, owns telegram:mybot"
        );
        let fenced = json!({
            "scheduler": {},
            "cluster": {"node": "node-a", "fenced": true, "sessions_here": 0, "error": "cluster database unavailable: refused"}
        });
        let text = status_text(&fenced, "http://127.0.0.1:4040", Style { color: false });
        let line = text.lines().find(|line| line.starts_with("cluster")).unwrap();
        assert_eq!(
            line,
            "cluster   node node-a fenced, sessions here: 0 (cluster database unavailable: refused)"
        );
        // Not a cluster node: no line.
        let single = json!({"scheduler": {}, "cluster": null});
        let text = status_text(&single, "http://127.0.0.1:4040", Style { color: false });
        assert!(!text.contains("cluster"), "{text}");
    }

    #[test]
    fn sizes_read_in_powers_of_a_thousand() {
        assert_eq!(size(999), "999 B");
        assert_eq!(size(1_500), "1.5 kB");
        assert_eq!(size(12_300_000_000), "12.3 GB");
        assert_eq!(size(252_000_000_000_000), "252.0 TB");
    }

    #[test]
    fn events_read_as_lines() {
        let action =
            json!({"index": 3, "action": {"phase": "started", "kind": "tool", "title": "Bash ls"}});
        assert_eq!(
            event_line("engine_action", &action),
            "   3 engine_action     started tool: Bash ls"
        );
        let done = json!({"index": 9, "status": "failed", "error": "boom"});
        assert_eq!(event_line("run_completed", &done), "   9 run_completed     failed: boom");
        let decided = json!({"index": 5, "action": {"phase": "completed", "kind": "approval",
            "title": "approval: bash", "message": "denied by @ann via telegram"}});
        assert_eq!(
            event_line("engine_action", &decided),
            "   5 engine_action     completed approval: approval: bash (denied by @ann via telegram)"
        );
    }

    #[test]
    fn a_run_of_outside_text_is_marked_in_its_line() {
        let run = json!({"run_id": "r1", "status": "completed", "engine": "lemon",
            "prompt": "deploy", "untrusted": "webhook ci"});
        let line = run_line(&run, Style { color: false });
        assert!(line.ends_with("[untrusted] deploy"), "{line}");
        let own = json!({"run_id": "r2", "status": "completed", "engine": "lemon",
            "prompt": "deploy", "untrusted": null});
        assert!(run_line(&own, Style { color: false }).ends_with("  deploy"));
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(form_value("running"), "running");
        assert_eq!(form_value("a&b=c d"), "a%26b%3Dc%20d");
    }
}
