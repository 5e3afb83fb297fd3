//! `status`, `engines`, `runs` and `logs`: a running gateway's state for people
//! (short aligned text) or for scripts (`--json`).

use serde_json::Value;

use crate::client::Client;
use crate::failure;
use crate::progress::one_line;
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
        let reason = one_line(engine["reason"].as_str().unwrap_or("unavailable"));
        format!("{id:<12} {}", style.red(&format!("unavailable: {reason}")))
    }
}

/// The human summary of `/v1/status`.
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
        let bytes = |key: &str| size(store.get(key).and_then(Value::as_u64).unwrap_or(0));
        out.push(format!(
            "store     {} (log {}) at {}",
            bytes("bytes"),
            bytes("log_bytes"),
            store.get("path").and_then(Value::as_str).unwrap_or("?")
        ));
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
                line.push_str(&format!(": {}", one_line(text)));
            }
        }
        out.push(line);
    }
    out.join("\n")
}

/// `status [--json]`.
///
/// # Errors
/// The gateway unreachable or refusing.
#[allow(clippy::print_stdout)] // The command's own output.
pub async fn status(client: &Client, json: bool, style: Style) -> anyhow::Result<u8> {
    let status = client.get("/v1/status").await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        println!("{}", status_text(&status, client.url(), style));
    }
    Ok(failure::OK)
}

/// `engines [--json]`: each engine with its availability (or why not).
///
/// # Errors
/// The gateway unreachable or refusing.
#[allow(clippy::print_stdout)] // The command's own output.
pub async fn engines(client: &Client, json: bool, style: Style) -> anyhow::Result<u8> {
    let status = client.get("/v1/status").await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status["engines"])?);
        return Ok(failure::OK);
    }
    let default = status["default_engine"].as_str().unwrap_or("");
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
        println!("{line}");
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
    format!(
        "{:<44} {painted}{pad} {:<12} {took:>7}  {prompt}",
        run["run_id"].as_str().unwrap_or("?"),
        run["engine"].as_str().unwrap_or("?"),
    )
}

/// `runs [--status S] [--limit N] [--json]`, newest first.
///
/// # Errors
/// The gateway unreachable or refusing (a bad status).
#[allow(clippy::print_stdout)] // The command's own output.
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
        println!("{}", serde_json::to_string_pretty(&answer["runs"])?);
        return Ok(failure::OK);
    }
    for run in answer["runs"].as_array().into_iter().flatten() {
        println!("{}", run_line(run, style));
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

/// `logs RUN [--json]`: the run's events, following a live run to its end.
///
/// # Errors
/// The gateway unreachable, the run unknown, the connection lost.
#[allow(clippy::print_stdout)] // The command's own output.
pub async fn logs(client: &Client, run_id: &str, json: bool) -> anyhow::Result<u8> {
    let mut events = client.events(run_id).await?;
    while let Some((kind, data)) = events.next().await? {
        if json {
            println!("{}", serde_json::to_string(&data)?);
        } else {
            println!("{}", event_line(&kind, &data));
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
            "store": {"path": "/home/me/.lemon/lemon.db", "bytes": 48_213_504, "log_bytes": 1_048_576}
        });
        let text = status_text(&status, "http://127.0.0.1:4040", Style { color: false });
        assert_eq!(
            text,
            "gateway   http://127.0.0.1:4040, up 1m 5s (version 0.1.0)\n\
             slots     1 of 4 in use, 2 queued\n\
             store     48.2 MB (log 1.0 MB) at /home/me/.lemon/lemon.db\n\
             engines   echo         available (default)\n\
             \x20         claude       unavailable: claude not found on PATH\n\
             channels  telegram     failing: 401\n\
             \x20         webhook      running"
        );
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
