//! The command line: `serve` (the default), `run`, `attach`, `cancel`, `runs`,
//! `logs`, `status`, `engines`, `config` (`check [FILE]`, `path`, `schema`,
//! `reference`, `init`), `secrets` (`set`, `list`, `delete`, `migrate`),
//! `doctor`, `mcp`, `completions` and the hidden `docs cli`. The binaries are
//! one-line wrappers around [`main`]; exit codes are in [`crate::failure`].

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use crate::approvals_cmd;
use crate::client::{Client, ClientConfig};
use crate::failure::{self, code_of};
use crate::run::{self as run_cmd, Interrupts, OnInterrupt, RunArgs, Ui};
use crate::show;
use crate::style::{ColorChoice, Style};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use lemon_server::paths::Paths;
use lemon_server::{self as server, ServeOptions};

#[derive(Debug, Parser)]
#[command(
    name = "lemon-gateway",
    version,
    about = "Self-hosted execution gateway for AI agents",
    after_help = failure::HELP
)]
struct Cli {
    /// Config file (default: $LEMON_CONFIG, else $LEMON_HOME/config.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
    /// When to use colours: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    color: ColorChoice,
    /// More output: the run id and actions even off a terminal; debug logs for `serve`.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,
    /// Less output: no progress, resume line or notices; warnings only for `serve`.
    #[arg(short, long, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

/// `--url` of the client commands.
#[derive(Debug, Clone, clap::Args)]
struct Remote {
    /// Gateway URL (default: from config, http://127.0.0.1:4040).
    #[arg(long, env = "LEMON_URL")]
    url: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Serve,
    /// Send a prompt to a running gateway, in this directory, and print the answer.
    #[command(after_help = failure::HELP)]
    Run {
        /// Continue the last session used from this directory.
        #[arg(short = 'c', long = "continue", conflicts_with = "session")]
        continue_session: bool,
        /// Session key (conversation) to use; default: a fresh session.
        #[arg(long)]
        session: Option<String>,
        /// Engine id, e.g. `echo` or `claude:opus`.
        #[arg(long)]
        engine: Option<String>,
        /// Directory the engine works in (default: the current one).
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// Print the final run record as JSON instead of the answer.
        #[arg(long, conflicts_with = "detach")]
        json: bool,
        /// Print the answer's text as it arrives also when stdout is not a
        /// terminal (on a terminal it always is).
        #[arg(long, conflicts_with_all = ["json", "detach"])]
        stream: bool,
        /// Print the run id and return without waiting.
        #[arg(long)]
        detach: bool,
        #[command(flatten)]
        remote: Remote,
        /// The prompt; several words are joined with spaces. `-` or a piped
        /// stdin reads it from stdin (after the words, when both are given).
        prompt: Vec<String>,
    },
    /// Follow a run to its end and print its answer (Ctrl-C stops following).
    Attach {
        /// The run: its id, the start of it, or `last`.
        run: String,
        /// Print the final run record as JSON instead of the answer.
        #[arg(long)]
        json: bool,
        /// Print the answer's text as it arrives also when stdout is not a
        /// terminal (on a terminal it always is).
        #[arg(long, conflicts_with = "json")]
        stream: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancel a queued or running run.
    Cancel {
        /// The run: its id, the start of it, or `last`.
        run: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// List runs, newest first.
    Runs {
        /// Only runs in this status: queued, running, completed, failed or cancelled.
        #[arg(long)]
        status: Option<String>,
        /// At most this many runs (default 50).
        #[arg(long)]
        limit: Option<usize>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Print a run's events, following a running run to its end.
    Logs {
        /// The run: its id, the start of it, or `last`.
        run: String,
        /// One JSON object per event.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Show a running gateway's state: uptime, slots, engines, channels.
    Status {
        /// Print the full status as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// List the engines and whether each is available.
    Engines {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Check, locate or start the config file; print its schema or reference.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Manage secrets (API keys, tokens) in the keychain or the secrets file.
    Secrets {
        #[command(subcommand)]
        command: SecretsCommand,
    },
    /// Tool calls waiting for your answer: list them, approve or deny one,
    /// or see which rule of `[gateway.approvals]` a call would hit.
    Approvals {
        #[command(subcommand)]
        command: Option<ApprovalsCommand>,
        /// Print JSON (the list).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: Remote,
    },
    /// Approve a tool call waiting for an answer (its id from `approvals`).
    Approve {
        /// The request's id (`apr_…`).
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Deny a tool call waiting for an answer: it is not run.
    Deny {
        /// The request's id (`apr_…`).
        id: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Write a conversation (prompts, answers, actions, engines, times,
    /// spend), oldest first, to stdout.
    Export {
        /// The session's key.
        #[arg(long)]
        session: String,
        /// `jsonl` (one run per line) or `markdown`.
        #[arg(long, default_value = "jsonl", value_parser = ["jsonl", "markdown"])]
        format: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Copy the database (runs, events, sessions) to a new file, consistently,
    /// while the gateway runs or not.
    Backup {
        /// The new file (0600); an existing file is never overwritten.
        file: PathBuf,
    },
    /// Put a backup in place of the database; refused while a gateway runs on
    /// this home. The replaced database is kept as `lemon.db.before-restore`.
    Restore {
        /// A file `backup` wrote.
        file: PathBuf,
    },
    /// Check config, keychain, ports, engines, keys and channels; each line
    /// ok / warn / fail with its fix. Exits 1 when a check fails.
    Doctor,
    /// Print the API token the dashboard and the clients sign in with.
    Token,
    /// Serve MCP on stdin/stdout for an MCP client that starts a command
    /// (Claude Desktop, Cursor): the running gateway's tools, and `run`,
    /// `status`, `cancel` and `runs` to start and follow runs on its engines.
    Mcp {
        #[command(flatten)]
        remote: Remote,
    },
    /// Print a shell completion script.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print reference pages printed from the code.
    #[command(hide = true)]
    Docs {
        #[command(subcommand)]
        command: DocsCommand,
    },
}

#[derive(Debug, Subcommand)]
enum DocsCommand {
    /// The command-line reference as Markdown (docs/reference/cli.md).
    Cli,
}

#[derive(Debug, Subcommand)]
enum ApprovalsCommand {
    /// Which rule a call would hit, from the config file alone:
    /// `approvals test 'bash: rm -rf build'`.
    Test {
        /// `tool: subject` (the command, the path or the host).
        call: String,
        /// The engine the call would run on: its `[gateway.approvals.engines]` rules apply.
        #[arg(long, default_value = "lemon")]
        engine: String,
        /// The run's directory: the project whose root holds it lends its rules.
        #[arg(long)]
        cwd: Option<std::path::PathBuf>,
        /// The chat the message came from, `transport:chat_id[:topic_id]`:
        /// its binding lends its rules (and its project's).
        #[arg(long)]
        chat: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum SecretsCommand {
    /// Save a secret: the value is read from a hidden prompt, or from stdin
    /// when it is not a terminal (never from the command line).
    Set {
        /// The secret's name, e.g. telegram_bot_token (a-z, 0-9 and _).
        name: String,
    },
    /// List the secrets, where each is kept and what uses it (never values).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a secret from the keychain and the secrets file.
    Delete {
        /// The secret's name.
        name: String,
    },
    /// Move every secret of the secrets file into the keychain.
    Migrate,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Check a config file as the gateway would load it (default: the one in use).
    Check {
        /// The file to check.
        file: Option<PathBuf>,
    },
    /// Print where the config file is read from.
    Path,
    /// Print the JSON Schema of config.toml, for editors and validators.
    Schema,
    /// Print the reference of every config.toml key (type, default, allowed
    /// values, meaning), as Markdown.
    Reference,
    /// Write a commented starter config.toml, and config.schema.json beside
    /// it for editors; an existing config is never replaced without --force.
    Init {
        /// Where to write it (default: the config file in use).
        #[arg(long, value_name = "FILE")]
        path: Option<PathBuf>,
        /// Replace an existing file.
        #[arg(long)]
        force: bool,
    },
}

fn init_logging(cli: &Cli) {
    // Every command but `serve` prints its own output: its log says only what
    // went wrong, `-v` adds what it did, `-vv` the libraries' detail.
    let serve = matches!(cli.command, None | Some(Command::Serve));
    let default = match (serve, cli.quiet, cli.verbose) {
        (_, true, _) | (false, false, 0) => "warn",
        (true, false, 0) | (false, false, 1) => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEMON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = cli.color.enabled(std::io::stderr().is_terminal(), environment());
    // A log line that cannot be written (stderr on a full disk, a closed
    // pipe) is lost: reporting it with `eprintln!` would panic the task that
    // logged, and drop the connection it was answering.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    match cli.log_format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The line printed once when the API token was generated: plain text, or
/// with `--log-format json` a JSON object like the log lines around it.
fn token_line(token: &str, secrets: &std::path::Path, format: LogFormat) -> String {
    match format {
        LogFormat::Human => {
            format!("API token (saved to {}, shown once): {token}", secrets.display())
        }
        LogFormat::Json => serde_json::json!({
            "level": "INFO",
            "fields": { "message": "API token generated (saved, shown once)" },
            "api_token": token,
            "saved_to": secrets.display().to_string(),
        })
        .to_string(),
    }
}

/// `lemon-gateway ready api=… health=… <channel>=…` on stdout: the one line
/// scripts wait for, with every enabled channel's address or state; with
/// `--log-format json` a JSON object like the log lines (`fields.message` is
/// `lemon-gateway ready`, the addresses beside it).
fn ready_line(running: &server::Running, format: LogFormat) -> String {
    let api = format!("http://{}", running.api_addr);
    let health = format!("http://{}", running.health_addr);
    match format {
        LogFormat::Human => {
            let mut line = format!("lemon-gateway ready api={api} health={health}");
            for (id, at) in &running.channels {
                line.push_str(&format!(" {id}={at}"));
            }
            line
        }
        LogFormat::Json => {
            let mut fields = serde_json::json!({
                "message": "lemon-gateway ready",
                "api": api,
                "health": health,
            });
            for (id, at) in &running.channels {
                fields[id.as_str()] = serde_json::json!(at.to_string());
            }
            serde_json::json!({ "level": "INFO", "fields": fields, "target": "lemon_gateway" })
                .to_string()
        }
    }
}

fn user_home(env: &BTreeMap<String, String>) -> Option<PathBuf> {
    env.get("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

fn client(paths: &Paths, env: &BTreeMap<String, String>, remote: Remote) -> anyhow::Result<Client> {
    Ok(Client::new(ClientConfig::resolve(paths, env.clone(), remote.url)?))
}

// The binary's own output goes to the terminal.
#[allow(clippy::print_stdout, clippy::print_stderr)]
async fn main_inner(cli: Cli) -> anyhow::Result<u8> {
    let env = environment().clone();
    let paths = Paths::resolve(cli.config.clone(), &env, user_home(&env));
    let ui = Ui {
        out: Style { color: cli.color.enabled(std::io::stdout().is_terminal(), &env) },
        err: Style { color: cli.color.enabled(std::io::stderr().is_terminal(), &env) },
        verbose: cli.verbose,
        quiet: cli.quiet,
    };
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            // A service manager that stopped reading stdout stops nothing.
            crate::out::keep_going_on_closed_pipe();
            // Listening before the ready line: a SIGTERM right after it drains.
            let signals = StopSignals::listen();
            let opts = ServeOptions {
                paths: paths.clone(),
                env: env.clone(),
                user_home: user_home(&env),
                launch_token: None,
            };
            let running = server::start(opts).await?;
            if let Some(token) = &running.generated_token {
                eprintln!("{}", token_line(token.expose(), &paths.secrets(), cli.log_format));
            }
            crate::say!("{}", ready_line(&running, cli.log_format));
            signals.wait(running.stop_requested()).await;
            let fenced = running.fenced();
            running.shutdown().await?;
            Ok(if fenced { failure::FENCED } else { failure::OK })
        }
        Command::Run {
            continue_session,
            session,
            engine,
            cwd,
            json,
            stream,
            detach,
            remote,
            prompt,
        } => {
            let client = client(&paths, &env, remote)?;
            let args =
                RunArgs { session, continue_session, engine, cwd, json, stream, detach, prompt };
            run_cmd::run(&client, args, ui, &paths.home).await
        }
        Command::Attach { run, json, stream, remote } => {
            let mut interrupts = Interrupts::listen()?;
            let client = client(&paths, &env, remote)?;
            let run = show::resolve_run(&client, &run).await?;
            let answer = run_cmd::Answer::new(json, stream);
            run_cmd::follow(&client, &run, ui, OnInterrupt::Detach, answer, &mut interrupts).await
        }
        Command::Approvals {
            command: Some(ApprovalsCommand::Test { call, engine, cwd, chat }),
            ..
        } => approvals_cmd::test(&paths.config, &call, &engine, cwd.as_deref(), chat.as_deref()),
        Command::Approvals { command: None, json, remote } => {
            approvals_cmd::list(&client(&paths, &env, remote)?, json).await
        }
        Command::Approve { id, remote } => {
            approvals_cmd::decide(&client(&paths, &env, remote)?, &id, true).await
        }
        Command::Deny { id, remote } => {
            approvals_cmd::decide(&client(&paths, &env, remote)?, &id, false).await
        }
        Command::Cancel { run, remote } => {
            let client = client(&paths, &env, remote)?;
            run_cmd::cancel(&client, &show::resolve_run(&client, &run).await?).await
        }
        Command::Runs { status, limit, json, remote } => {
            let client = client(&paths, &env, remote)?;
            show::runs(&client, status.as_deref(), limit, json, ui.out).await
        }
        Command::Logs { run, json, remote } => {
            let client = client(&paths, &env, remote)?;
            show::logs(&client, &show::resolve_run(&client, &run).await?, json).await
        }
        Command::Status { json, remote } => {
            show::status(&client(&paths, &env, remote)?, json, ui.out).await
        }
        Command::Engines { json, remote } => {
            show::engines(&client(&paths, &env, remote)?, json, ui.out).await
        }
        Command::Config { command: ConfigCommand::Path } => {
            crate::say!("{}", paths.config.display());
            Ok(failure::OK)
        }
        Command::Config { command: ConfigCommand::Schema } => {
            crate::say_raw!("{}", crate::config_cmd::schema_json()?);
            Ok(failure::OK)
        }
        Command::Config { command: ConfigCommand::Reference } => {
            crate::say_raw!("{}", crate::config_cmd::reference()?);
            Ok(failure::OK)
        }
        Command::Config { command: ConfigCommand::Init { path, force } } => {
            let target = path.unwrap_or_else(|| paths.config.clone());
            let written = crate::config_cmd::init(&target, force).map_err(|error| {
                match error.downcast::<crate::config_cmd::InitError>() {
                    Ok(refused) => anyhow::Error::new(failure::Failure::usage(refused.to_string())),
                    Err(other) => other,
                }
            })?;
            crate::say!("wrote {}", written.config.display());
            crate::say!("wrote {} (the schema its #:schema line names)", written.schema.display());
            crate::say!("check it with: lemon-gateway config check {}", written.config.display());
            Ok(failure::OK)
        }
        Command::Docs { command: DocsCommand::Cli } => {
            crate::say_raw!("{}", crate::cli_reference::render(&command()));
            Ok(failure::OK)
        }
        Command::Config { command: ConfigCommand::Check { file } } => {
            let file = file.unwrap_or_else(|| paths.config.clone());
            match server::check_config(&file, &paths, &env) {
                Ok(warnings) => {
                    for warning in warnings {
                        eprintln!("warning: {warning}");
                    }
                    if let Ok(loaded) = lemon_core::config::load_file_or_default(&file) {
                        crate::say!("{}", approvals_cmd::summary(&loaded.config.gateway));
                    }
                    crate::say!("{}: ok", file.display());
                    Ok(failure::OK)
                }
                Err(error) => {
                    eprintln!("{error}");
                    Ok(failure::CONFIG)
                }
            }
        }
        Command::Secrets { command } => match command {
            SecretsCommand::Set { name } => crate::secrets_cmd::set(&paths, &env, &name),
            SecretsCommand::List { json } => crate::secrets_cmd::list(&paths, &env, json),
            SecretsCommand::Delete { name } => crate::secrets_cmd::delete(&paths, &env, &name),
            SecretsCommand::Migrate => crate::secrets_cmd::migrate(&paths, &env),
        },
        Command::Export { session, format, remote } => {
            let client = client(&paths, &env, remote)?;
            let path =
                format!("/v1/sessions/{}/export?format={format}", show::form_value(&session));
            crate::say_raw!("{}", client.get_text(&path).await?);
            Ok(failure::OK)
        }
        Command::Backup { file } => {
            refuse_postgres(&paths, "back up")?;
            let copied = lemon_core::store::sqlite::backup(&paths.database(), &file)?;
            crate::say!(
                "backed up {} runs ({}) to {}",
                copied.runs,
                show::size(copied.bytes),
                copied.path.display()
            );
            Ok(failure::OK)
        }
        Command::Restore { file } => {
            refuse_postgres(&paths, "restore")?;
            let copied = lemon_core::store::sqlite::restore(&paths.database(), &file)?;
            crate::say!(
                "restored {} runs ({}) from {} into {}; the replaced database is kept as {}.before-restore",
                copied.runs,
                show::size(copied.bytes),
                file.display(),
                copied.path.display(),
                copied.path.display()
            );
            Ok(failure::OK)
        }
        Command::Doctor => crate::doctor::doctor(&paths, &env, ui.out).await,
        Command::Mcp { remote } => {
            crate::mcp_cmd::serve(ClientConfig::resolve(&paths, env.clone(), remote.url)?).await
        }
        Command::Token => {
            let secrets = server::open_secrets(&paths, &env);
            let name = server::API_TOKEN_SECRET;
            match secrets.get(name)? {
                Some(token) => {
                    crate::say!("{}", token.expose());
                    Ok(failure::OK)
                }
                None => Err(crate::client::ClientError::NoToken {
                    var: lemon_core::secrets::env_var_name(name),
                    file: paths.secrets(),
                }
                .into()),
            }
        }
        Command::Completions { shell } => {
            let mut out = std::io::stdout();
            clap_complete::generate(shell, &mut Cli::command(), "lemon-gateway", &mut out);
            out.flush()?;
            Ok(failure::OK)
        }
    }
}

/// The command line's definition, for its reference page.
pub fn command() -> clap::Command {
    Cli::command()
}

/// `backup` and `restore` copy the SQLite file: with a PostgreSQL store they
/// would copy a file the gateway does not use.
fn refuse_postgres(paths: &Paths, what: &str) -> anyhow::Result<()> {
    let backend = lemon_core::config::load_file_or_default(&paths.config)
        .map(|loaded| loaded.config.gateway.store.backend)
        .unwrap_or_default();
    if backend == lemon_core::config::StoreBackendKind::Postgres {
        anyhow::bail!(
            "the store is PostgreSQL ([gateway.store] backend = \"postgres\" in {}): {what} it with the database's own tools (pg_dump and pg_restore, or base backups)",
            paths.config.display()
        );
    }
    Ok(())
}

/// The runtime threads `serve` starts: `[gateway] worker_threads` of the
/// config file, or the default for this machine's CPUs. A file that cannot be
/// read or has errors gets the default here; the start reports it.
fn serve_worker_threads(cli: &Cli) -> usize {
    let env = environment();
    let paths = Paths::resolve(cli.config.clone(), env, user_home(env));
    let gateway = lemon_core::config::load_file_or_default(&paths.config)
        .map(|loaded| loaded.config.gateway)
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = gateway.worker_threads_for(cpus);
    tracing::info!(threads, cpus, "async runtime");
    threads
}

/// The process environment as it was at start ([`main`] takes it before it
/// blanks the secrets' entries of the block).
static ENVIRONMENT: std::sync::OnceLock<BTreeMap<String, String>> = std::sync::OnceLock::new();

fn environment() -> &'static BTreeMap<String, String> {
    ENVIRONMENT.get_or_init(lemon_engines::cli::environment)
}

/// Parses the command line and runs the command; the process exit code (see
/// [`crate::failure`]).
#[allow(clippy::print_stderr)] // The binary reports fatal errors on the terminal.
pub fn main() -> ExitCode {
    // First of all, before any other thread: the environment may hold secrets
    // (`LEMON_API_TOKEN`, provider keys). They are kept in memory and blanked in
    // the block /proc shows, and no process this one starts may read its memory.
    let sealed = match lemon_engines::cli::seal_environment() {
        Ok(sealed) => sealed,
        Err((sealed, why)) => {
            eprintln!("lemon-gateway: warning: secrets stay readable in this process's environment block: {why}");
            sealed
        }
    };
    let blanked = sealed.blanked;
    let _ = ENVIRONMENT.set(sealed.vars);
    if let Err(error) = lemon_engines::cli::hide_from_children() {
        eprintln!("lemon-gateway: {error}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    init_logging(&cli);
    if !blanked.is_empty() {
        tracing::debug!(names = %blanked.join(" "), "secrets blanked in the process's environment block");
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if matches!(cli.command, None | Some(Command::Serve)) {
        builder.worker_threads(serve_worker_threads(&cli));
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lemon-gateway: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let style = Style { color: cli.color.enabled(std::io::stderr().is_terminal(), environment()) };
    match runtime.block_on(main_inner(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("{} {error:#}", style.red("lemon-gateway:"));
            ExitCode::from(code_of(&error))
        }
    }
}

/// SIGINT and SIGTERM, listened for from the moment this is made.
struct StopSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn listen() -> Self {
        let listen = |kind: tokio::signal::unix::SignalKind, name: &str| {
            tokio::signal::unix::signal(kind)
                .map_err(|error| tracing::warn!(%error, "cannot listen for {name}"))
                .ok()
        };
        StopSignals {
            interrupt: listen(tokio::signal::unix::SignalKind::interrupt(), "SIGINT"),
            terminate: listen(tokio::signal::unix::SignalKind::terminate(), "SIGTERM"),
        }
    }

    /// Waits for SIGINT or SIGTERM, or for `token` to be cancelled.
    async fn wait(mut self, token: tokio_util::sync::CancellationToken) {
        async fn next(signal: Option<&mut tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        tokio::select! {
            () = next(self.interrupt.as_mut()) => {}
            () = next(self.terminate.as_mut()) => {}
            () = token.cancelled() => {}
        }
    }
}
