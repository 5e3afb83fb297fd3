//! What a run is doing, on stderr while it runs: a spinner line with the engine
//! and the elapsed time, and one line per action (tool call, command…) as it
//! starts. Drawn only when stderr is a terminal; otherwise only `-v` prints the
//! actions, as plain lines.

use std::collections::HashSet;
use std::io::Write;

use serde_json::Value;
use tokio::time::Instant;

use crate::style::Style;

const FRAMES: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing.
    Off,
    /// Actions as plain lines (stderr is not a terminal, `-v`).
    Lines,
    /// The spinner and the actions (stderr is a terminal).
    Spinner,
}

/// The progress display of one run.
#[derive(Debug)]
pub struct Progress {
    mode: Mode,
    style: Style,
    engine: String,
    started: Instant,
    frame: usize,
    drawn: bool,
    seen: HashSet<String>,
}

impl Progress {
    pub fn new(mode: Mode, style: Style) -> Self {
        Progress {
            mode,
            style,
            engine: String::new(),
            started: Instant::now(),
            frame: 0,
            drawn: false,
            seen: HashSet::new(),
        }
    }

    /// Whether the spinner needs ticks.
    pub fn animated(&self) -> bool {
        self.mode == Mode::Spinner
    }

    /// Redraws the spinner with the next frame.
    pub fn tick(&mut self) {
        if self.mode != Mode::Spinner {
            return;
        }
        self.frame = (self.frame + 1) % FRAMES.len();
        self.draw();
    }

    fn draw(&mut self) {
        let elapsed = self.started.elapsed().as_secs_f64();
        let engine = if self.engine.is_empty() { "waiting" } else { &self.engine };
        let line = format!(
            "\r\x1b[2K{} {} {}",
            self.style.yellow(FRAMES[self.frame]),
            self.style.bold(engine),
            self.style.dim(&format!("{elapsed:.1}s")),
        );
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(line.as_bytes());
        let _ = err.flush();
        self.drawn = true;
    }

    /// Removes the spinner line.
    pub fn clear(&mut self) {
        if self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(b"\r\x1b[2K");
            let _ = err.flush();
            self.drawn = false;
        }
    }

    /// Prints `line` above the spinner.
    pub fn note(&mut self, line: &str) {
        if self.mode == Mode::Off {
            return;
        }
        self.clear();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "{line}");
        drop(err);
        if self.mode == Mode::Spinner {
            self.draw();
        }
    }

    /// Takes one event of the run (`type`, JSON data).
    pub fn event(&mut self, kind: &str, data: &Value) {
        match kind {
            "run_started" => {
                if let Some(engine) = data["engine"].as_str() {
                    engine.clone_into(&mut self.engine);
                }
                // The time counts from the run's start, also when attaching later.
                if let Some(started) = data["ts_ms"].as_u64().and_then(since) {
                    self.started = started;
                }
                if self.mode == Mode::Spinner {
                    self.draw();
                }
            }
            "engine_action" => {
                if let Some(line) = self.action_line(&data["action"]) {
                    self.note(&line);
                }
            }
            _ => {}
        }
    }

    /// The line for an action: once when it starts (or when it is first seen),
    /// and again when it fails.
    fn action_line(&mut self, action: &Value) -> Option<String> {
        let id = action["id"].as_str().unwrap_or_default().to_owned();
        let kind = action["kind"].as_str().unwrap_or("action");
        let title = one_line(action["title"].as_str().unwrap_or_default());
        let failed = action["phase"] == "completed" && action["ok"] == false;
        if failed {
            let message = one_line(action["message"].as_str().unwrap_or("failed"));
            return Some(format!("  {} {kind}: {title}: {message}", self.style.red("✗")));
        }
        if !self.seen.insert(id) {
            return None;
        }
        Some(format!("  {} {kind}: {title}", self.style.dim("▸")))
    }
}

/// The instant `ts_ms` (milliseconds since the epoch) was, if it is in the past.
fn since(ts_ms: u64) -> Option<Instant> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?;
    let ago = u64::try_from(now.as_millis()).ok()?.checked_sub(ts_ms)?;
    Instant::now().checked_sub(std::time::Duration::from_millis(ago))
}

/// Outside text as one line without control characters, whole.
pub fn flat(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Outside text as one short line without control characters.
pub fn one_line(text: &str) -> String {
    const MAX: usize = 120;
    let mut out = flat(text);
    if out.chars().count() > MAX {
        out = out.chars().take(MAX - 1).collect();
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_action_is_shown_when_it_starts_and_again_only_if_it_fails() {
        let mut progress = Progress::new(Mode::Lines, Style { color: false });
        let started =
            json!({"id": "t1", "kind": "tool", "title": "Bash ls\n-la", "phase": "started"});
        assert_eq!(progress.action_line(&started).as_deref(), Some("  ▸ tool: Bash ls -la"));
        let done = json!({"id": "t1", "kind": "tool", "title": "Bash ls", "phase": "completed", "ok": true});
        assert_eq!(progress.action_line(&done), None);
        let failed = json!({"id": "t1", "kind": "tool", "title": "Bash ls", "phase": "completed", "ok": false, "message": "exit 2"});
        assert_eq!(progress.action_line(&failed).as_deref(), Some("  ✗ tool: Bash ls: exit 2"));
    }

    #[test]
    fn outside_text_becomes_one_bounded_line() {
        assert_eq!(one_line("a\u{1b}[31mb\r\nc"), "a [31mb c");
        assert_eq!(one_line(&"x".repeat(500)).chars().count(), 120);
    }
}
