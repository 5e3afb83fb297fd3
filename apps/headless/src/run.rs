//! `run`, `attach` and `cancel`: submit a prompt in a directory and session,
//! follow the run's events to its end, and answer Ctrl-C.
//!
//! Output: the answer alone on stdout, its text streamed as it arrives when
//! stdout is a terminal or `--stream` is given (or the final record with
//! `--json`); progress, notices and the resume line on stderr. An approval request of
//! the run is asked there too ([`crate::ask`]).

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::{json, Value};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::ask::{Asker, Typed};
use crate::client::{Client, ClientError};
use crate::failure::{self, Failure};
use crate::last_session;
use crate::progress::{Mode, Progress};
use crate::style::Style;

/// How the command line wants output.
#[derive(Debug, Clone, Copy)]
pub struct Ui {
    /// Colours on stdout.
    pub out: Style,
    /// Colours on stderr.
    pub err: Style,
    /// `-v` given (how often).
    pub verbose: u8,
    /// `-q` given.
    pub quiet: bool,
}

impl Ui {
    fn progress_mode(&self) -> Mode {
        if self.quiet {
            Mode::Off
        } else if std::io::stderr().is_terminal() {
            Mode::Spinner
        } else if self.verbose > 0 {
            Mode::Lines
        } else {
            Mode::Off
        }
    }
}

/// What `run` was asked.
#[derive(Debug, Clone)]
pub struct RunArgs {
    pub session: Option<String>,
    pub continue_session: bool,
    pub engine: Option<String>,
    pub cwd: Option<PathBuf>,
    pub json: bool,
    /// Print the answer's text as it arrives also when stdout is not a terminal.
    pub stream: bool,
    pub detach: bool,
    pub prompt: Vec<String>,
}

/// Ctrl-C, listened to from before the run is submitted, so no interrupt
/// falls between submitting and following.
#[derive(Debug)]
pub struct Interrupts(Signal);

impl Interrupts {
    /// # Errors
    /// The signal handler cannot be installed.
    pub fn listen() -> anyhow::Result<Self> {
        Ok(Interrupts(signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?))
    }

    async fn recv(&mut self) {
        if self.0.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

/// The prompt from the arguments and, when it is piped or `-` is given, stdin:
/// `git diff | lemon-gateway run "review this"` is `"review this\n\n<diff>"`.
///
/// # Errors
/// No prompt at all (usage), or stdin cannot be read.
pub fn prompt(words: &[String]) -> anyhow::Result<String> {
    let dash = words.len() == 1 && words[0] == "-";
    let args = if dash { String::new() } else { words.join(" ") };
    let stdin = if dash || !std::io::stdin().is_terminal() {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read the prompt from stdin")?;
        text
    } else {
        String::new()
    };
    join_prompt(&args, &stdin).ok_or_else(|| {
        Failure::usage("no prompt: give it as arguments, or pipe it in (`run -` reads stdin)")
            .into()
    })
}

fn join_prompt(args: &str, stdin: &str) -> Option<String> {
    let (args, stdin) = (args.trim(), stdin.trim_end());
    match (args.is_empty(), stdin.trim().is_empty()) {
        (true, true) => None,
        (false, true) => Some(args.to_owned()),
        (true, false) => Some(stdin.to_owned()),
        (false, false) => Some(format!("{args}\n\n{stdin}")),
    }
}

/// The working directory to send: `--cwd` or the current one, absolute.
fn working_dir(cwd: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match cwd {
        Some(dir) => dir.to_owned(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    std::fs::canonicalize(&dir)
        .ok()
        .filter(|dir| dir.is_dir())
        .ok_or_else(|| Failure::usage(format!("--cwd {}: not a directory", dir.display())).into())
}

/// A new session key for a run that continues nothing.
fn fresh_session() -> String {
    format!("cli-{}", uuid::Uuid::now_v7().simple())
}

/// `run`: submits the prompt and follows the run; the exit code.
///
/// # Errors
/// Usage mistakes, and the gateway unreachable or refusing.
#[allow(clippy::print_stdout, clippy::print_stderr)] // The command's own output.
pub async fn run(client: &Client, args: RunArgs, ui: Ui, state_home: &Path) -> anyhow::Result<u8> {
    let prompt = prompt(&args.prompt)?;
    // Listening from before the submit, so an early Ctrl-C is answered too; and
    // only after stdin is read, so Ctrl-C still ends a prompt being typed.
    let mut interrupts = Interrupts::listen()?;
    let cwd = working_dir(args.cwd.as_deref())?;
    let record = last_session::file(state_home);
    let session = match (args.session, args.continue_session) {
        (Some(session), _) => session,
        (None, true) => last_session::get(&record, &cwd).ok_or_else(|| {
            Failure::usage(format!(
                "no earlier session in {}: run without --continue to start one",
                cwd.display()
            ))
        })?,
        (None, false) => fresh_session(),
    };
    let body = json!({
        "prompt": prompt,
        "session_key": session,
        "engine": args.engine,
        "cwd": cwd,
    });
    let accepted = client.post("/v1/runs", &body).await.map_err(|error| match error {
        ClientError::Refused { message, .. } => anyhow::Error::new(Failure::run(format!(
            "the gateway refused the run in {}: {message}",
            cwd.display()
        ))),
        other => other.into(),
    })?;
    // Slash commands (`/status`, `/cancel`, …) are answered at once, without a run.
    if let (Some(_), Some(reply)) = (accepted["command"].as_str(), accepted["reply"].as_str()) {
        crate::say!("{reply}");
        return Ok(failure::OK);
    }
    let run_id = accepted["run_id"]
        .as_str()
        .ok_or_else(|| ClientError::Protocol("an accepted run without a run id".to_owned()))?
        .to_owned();
    if let Err(error) = last_session::set(&record, &cwd, &session) {
        if !ui.quiet {
            eprintln!("warning: cannot remember the session for --continue: {error:#}");
        }
    }
    if ui.verbose > 0 {
        eprintln!("run {run_id}: session {session} in {}", cwd.display());
    }
    if args.detach {
        crate::say!("{run_id}");
        return Ok(failure::OK);
    }
    let answer = Answer::new(args.json, args.stream);
    follow(client, &run_id, ui, OnInterrupt::Cancel, answer, &mut interrupts).await
}

/// How `follow` prints the answer.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    /// The final record as JSON instead of the answer.
    json: bool,
    /// The answer's text as it arrives.
    live: bool,
    /// stdout is a terminal: control characters are dropped from the text and
    /// a line of it is ended before a progress line is written below it.
    terminal: bool,
}

impl Answer {
    /// Streamed when stdout is a terminal or `stream`; never with `json`.
    pub fn new(json: bool, stream: bool) -> Self {
        let terminal = std::io::stdout().is_terminal();
        Answer { json, live: !json && (stream || terminal), terminal }
    }
}

/// The answer's text on stdout as it arrives.
#[derive(Debug)]
struct Echo {
    answer: Answer,
    /// The text printed so far, as the engine sent it.
    sent: String,
    /// The last line printed is not ended yet.
    open_line: bool,
}

impl Echo {
    fn new(answer: Answer) -> Self {
        Echo { answer, sent: String::new(), open_line: false }
    }

    /// Prints a delta's text when the answer is streamed.
    fn delta(&mut self, text: &str) {
        if self.answer.live && !text.is_empty() {
            self.put(text);
            self.sent.push_str(text);
        }
    }

    fn put(&mut self, text: &str) {
        if self.answer.terminal {
            crate::say_raw!("{}", printable(text));
        } else {
            crate::say_raw!("{text}");
        }
        self.open_line = !text.ends_with('\n');
    }

    /// Ends a line of text on the terminal before something is written below it.
    fn break_line(&mut self) {
        if self.open_line && self.answer.terminal {
            crate::say!();
            self.open_line = false;
        }
    }

    /// Whether the spinner may be drawn (not over a line of text).
    fn at_line_start(&self) -> bool {
        !self.open_line
    }

    /// Prints what of the final `answer` was not streamed, and ends the line.
    fn finish(&mut self, answer: Option<&str>) {
        if let Some(answer) = answer {
            let rest = if self.sent.is_empty() {
                answer
            } else {
                // The terminal already shows what was streamed, also when the
                // final answer is only its last part.
                answer.strip_prefix(self.sent.as_str()).unwrap_or_default()
            };
            let rest = rest.trim_end_matches('\n');
            if !rest.is_empty() {
                self.put(rest);
            }
        }
        if self.open_line {
            crate::say!();
            self.open_line = false;
        }
    }
}

/// `text` without the control characters a terminal acts on (escape
/// sequences, carriage returns, bells), newlines and tabs kept.
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let acted_on = |c: char| c.is_control() && c != '\n' && c != '\t';
    if text.contains(acted_on) {
        text.chars().filter(|c| !acted_on(*c)).collect::<String>().into()
    } else {
        text.into()
    }
}

/// What the first Ctrl-C does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInterrupt {
    /// Cancel the run and wait for its end; a second one leaves it running.
    Cancel,
    /// Stop following; the run goes on.
    Detach,
}

/// Follows a run to its end, printing its answer as `answer` says; the exit code.
///
/// # Errors
/// The gateway unreachable or refusing, the connection lost.
#[allow(clippy::print_stdout, clippy::print_stderr)] // The command's own output.
pub async fn follow(
    client: &Client,
    run_id: &str,
    ui: Ui,
    on_interrupt: OnInterrupt,
    answer: Answer,
    interrupts: &mut Interrupts,
) -> anyhow::Result<u8> {
    let json = answer.json;
    let mut echo = Echo::new(answer);
    let mut events = client.events(run_id).await?;
    let mut progress = Progress::new(ui.progress_mode(), ui.err);
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    let mut interrupted = 0;
    let mut streamed = String::new();
    let mut asker = Asker::new(std::io::stdin().is_terminal(), ui.err);
    let completed: Value = loop {
        tokio::select! {
            event = events.next() => {
                let Some((kind, data)) = event? else {
                    progress.clear();
                    echo.finish(None);
                    return Err(ClientError::Lost {
                        url: client.url().to_owned(),
                        run_id: run_id.to_owned(),
                    }
                    .into());
                };
                if kind == "engine_action" {
                    echo.break_line();
                }
                progress.event(&kind, &data);
                if let Some(text) = asker.event(&kind, &data) {
                    progress.clear();
                    echo.break_line();
                    say(&text);
                }
                match kind.as_str() {
                    "delta" => {
                        let text = data["text"].as_str().unwrap_or_default();
                        if answer.live {
                            progress.clear();
                        }
                        echo.delta(text);
                        streamed.push_str(text);
                    }
                    "run_completed" => break data,
                    _ => {}
                }
            }
            line = asker.line() => match line {
                Some(line) => match asker.read(&line) {
                    Typed::Answer { id, decision } => {
                        let body = json!({ "decision": decision });
                        // Settled meanwhile elsewhere: the refusal says how; the event closes it.
                        if let Err(error) = client.post(&format!("/v1/approvals/{id}"), &body).await {
                            eprintln!("{id}: {error}");
                        }
                    }
                    Typed::Again => say(&asker.question()),
                },
                None => asker.stdin_closed(),
            },
            _ = ticker.tick(), if progress.animated() && !asker.asking() && echo.at_line_start() => progress.tick(),
            () = interrupts.recv() => {
                interrupted += 1;
                echo.break_line();
                if on_interrupt == OnInterrupt::Cancel && interrupted == 1 {
                    client.post(&format!("/v1/runs/{run_id}/cancel"), &json!({})).await?;
                    progress.clear();
                    eprintln!("cancelling run {run_id} (press Ctrl-C again to leave it running)");
                } else {
                    progress.clear();
                    eprintln!(
                        "left run {run_id} running; follow it with `lemon-gateway attach {run_id}`"
                    );
                    return Ok(failure::INTERRUPTED);
                }
            }
        }
    };
    progress.clear();
    let record = client.get(&format!("/v1/runs/{run_id}")).await?;
    let status = completed["status"].as_str().unwrap_or("failed");
    if json {
        crate::say!("{}", serde_json::to_string_pretty(&record)?);
    } else if status == "completed" {
        let text = completed["answer"].as_str().filter(|a| !a.is_empty()).unwrap_or(&streamed);
        echo.finish(Some(text));
    } else {
        echo.finish(None);
    }
    match status {
        "completed" => {
            if let Some(line) = record["resume_line"].as_str().filter(|_| !ui.quiet && !json) {
                eprintln!("\n{}", ui.err.dim(line));
            }
            Ok(failure::OK)
        }
        "cancelled" if interrupted > 0 => {
            eprintln!("run {run_id} cancelled");
            Ok(failure::INTERRUPTED)
        }
        "cancelled" => {
            eprintln!("run {run_id} was cancelled");
            Ok(failure::RUN_FAILED)
        }
        _ => {
            let error = completed["error"].as_str().unwrap_or("unknown error");
            eprintln!("{} run {run_id} failed: {error}", ui.err.red("error:"));
            Ok(failure::RUN_FAILED)
        }
    }
}

/// `text` on stderr; a question (ending in a space) stays on its line.
#[allow(clippy::print_stderr)]
fn say(text: &str) {
    if text.ends_with(' ') {
        eprint!("{text}");
    } else {
        eprintln!("{text}");
    }
}

/// `cancel RUN`.
///
/// # Errors
/// The gateway unreachable, or the run unknown.
#[allow(clippy::print_stdout)] // The command's own output.
pub async fn cancel(client: &Client, run_id: &str) -> anyhow::Result<u8> {
    let answer = client.post(&format!("/v1/runs/{run_id}/cancel"), &json!({})).await?;
    let status = answer["status"].as_str().unwrap_or("unknown");
    crate::say!("run {run_id}: {status}");
    Ok(failure::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piped_text_follows_the_arguments_after_a_blank_line() {
        assert_eq!(join_prompt("review this", "diff\n").as_deref(), Some("review this\n\ndiff"));
        assert_eq!(join_prompt("", "only stdin\n").as_deref(), Some("only stdin"));
        assert_eq!(join_prompt("only args", "  \n").as_deref(), Some("only args"));
        assert_eq!(join_prompt(" ", "\n"), None);
    }

    /// A model's text cannot drive the terminal it streams to: escape
    /// sequences (colours, a title, OSC 52 clipboard writes), carriage
    /// returns and bells are dropped; lines and tabs stay.
    #[test]
    fn streamed_text_cannot_drive_the_terminal() {
        let hostile = "ok\x1b]52;c;cm0gLXJmIH4=\x07\r\x1b[2Jdone\u{9b}31m\n\tnext";
        assert_eq!(printable(hostile), "ok]52;c;cm0gLXJmIH4=[2Jdone31m\n\tnext");
        assert!(matches!(printable("plain text\n"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn fresh_sessions_differ() {
        assert_ne!(fresh_session(), fresh_session());
        assert!(fresh_session().starts_with("cli-"));
    }
}
