//! The command line: `serve` (the default), `run`, `status` and `config`
//! (`check [FILE]`, `path`). The binaries are
//! one-line wrappers around [`main`].

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::client::{self, ClientConfig};
use clap::{Parser, Subcommand, ValueEnum};
use lemon_server::paths::Paths;
use lemon_server::{self as server, ServeOptions};

#[derive(Debug, Parser)]
#[command(name = "lemon-gateway", version, about = "Self-hosted execution gateway for AI agents")]
struct Cli {
    /// Config file (default: $LEMON_CONFIG, else $LEMON_HOME/config.toml).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Serve,
    /// Send a prompt to a running gateway and stream the answer.
    Run {
        /// Session key (conversation) to use.
        #[arg(long)]
        session: Option<String>,
        /// Engine id, e.g. `echo` or `claude:opus`.
        #[arg(long)]
        engine: Option<String>,
        /// Gateway URL (default: from config, http://127.0.0.1:4040).
        #[arg(long, env = "LEMON_URL")]
        url: Option<String>,
        /// The prompt; several words are joined with spaces.
        #[arg(required = true)]
        prompt: Vec<String>,
    },
    /// Show a running gateway's status.
    Status {
        /// Gateway URL (default: from config, http://127.0.0.1:4040).
        #[arg(long, env = "LEMON_URL")]
        url: Option<String>,
    },
    /// Check or locate the config file.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
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
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEMON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn user_home(env: &BTreeMap<String, String>) -> Option<PathBuf> {
    env.get("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
}

// The binary's own output goes to the terminal.
#[allow(clippy::print_stdout, clippy::print_stderr)]
async fn main_inner(cli: Cli) -> anyhow::Result<ExitCode> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let paths = Paths::resolve(cli.config.clone(), &env, user_home(&env));
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            let opts = ServeOptions { paths, env: env.clone(), user_home: user_home(&env) };
            let running = server::start(opts).await?;
            let api = format!("http://{}", running.api_addr);
            if let Some(token) = &running.generated_token {
                eprintln!("Control API: {api}");
                eprintln!("API token (saved, shown once): {}", token.expose());
            }
            println!("lemon-gateway ready api={api} health=http://{}", running.health_addr);
            std::io::stdout().flush()?;
            wait_for_signal(running.token()).await;
            running.shutdown().await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run { session, engine, url, prompt } => {
            let client = ClientConfig::resolve(&paths, env, url)?;
            let prompt = prompt.join(" ");
            let mut stdout = std::io::stdout();
            let outcome =
                client::run(&client, session.as_deref(), engine.as_deref(), &prompt, &mut stdout)
                    .await?;
            if outcome.ok {
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!(
                    "run {} failed: {}",
                    outcome.run_id,
                    outcome.error.as_deref().unwrap_or("unknown error")
                );
                Ok(ExitCode::FAILURE)
            }
        }
        Command::Config { command: ConfigCommand::Path } => {
            println!("{}", paths.config.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Config { command: ConfigCommand::Check { file } } => {
            let file = file.unwrap_or_else(|| paths.config.clone());
            match server::check_config(&file, &paths, &env) {
                Ok(warnings) => {
                    for warning in warnings {
                        eprintln!("warning: {warning}");
                    }
                    println!("{}: ok", file.display());
                    Ok(ExitCode::SUCCESS)
                }
                Err(error) => {
                    eprintln!("{error}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Status { url } => {
            let client = ClientConfig::resolve(&paths, env, url)?;
            let status = client::status(&client).await?;
            println!("{}", serde_json::to_string_pretty(&status)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Parses the command line and runs the command; the process exit code.
#[allow(clippy::print_stderr)] // The binary reports fatal errors on the terminal.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("lemon-gateway: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main_inner(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("lemon-gateway: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// Waits for SIGINT or SIGTERM, or for `token` to be cancelled.
async fn wait_for_signal(token: tokio_util::sync::CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
        () = token.cancelled() => {}
    }
}
