//! The process exit codes, and an error that carries its own.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | ok |
//! | 1 | the run failed, or another error (the gateway refused the request) |
//! | 2 | usage error |
//! | 3 | cannot reach the gateway |
//! | 4 | authentication (no token, or the gateway refused it) |
//! | 5 | configuration error |
//! | 75 | `serve`: the cluster node was fenced; start it again |
//! | 130 | cancelled by Ctrl-C |

use std::fmt;

use lemon_core::config::ConfigError;

use crate::client::ClientError;

pub const OK: u8 = 0;
pub const RUN_FAILED: u8 = 1;
pub const USAGE: u8 = 2;
pub const CONFIG: u8 = 5;
/// A cluster node that was fenced stopped; its supervisor starts it again.
pub const FENCED: u8 = lemon_server::cluster::FENCED_EXIT_CODE;
pub const INTERRUPTED: u8 = 130;

/// The exit codes as `--help` shows them.
pub const HELP: &str = "\
Exit codes:
  0    ok
  1    the run failed, or another error (the gateway refused the request)
  2    usage error
  3    cannot reach the gateway
  4    authentication (no API token, or the gateway refused it)
  5    configuration error
  75   serve: the cluster node was fenced (a supervisor should start it again)
  130  cancelled by Ctrl-C";

/// An error with the exit code it ends the process with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Self {
        Failure { code: USAGE, message: message.into() }
    }

    pub fn run(message: impl Into<String>) -> Self {
        Failure { code: RUN_FAILED, message: message.into() }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// The exit code of an error that ended a command: its own for a [`Failure`]
/// or a [`ClientError`], 5 for a config error anywhere in its chain, else 1.
pub fn code_of(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if let Some(failure) = cause.downcast_ref::<Failure>() {
            return failure.code;
        }
        if let Some(client) = cause.downcast_ref::<ClientError>() {
            return client.exit_code();
        }
        if cause.downcast_ref::<ConfigError>().is_some() {
            return CONFIG;
        }
    }
    RUN_FAILED
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn each_class_of_error_has_its_code() {
        let unreachable = ClientError::Unreachable { url: "http://x".to_owned() };
        assert_eq!(code_of(&anyhow::Error::new(unreachable)), 3);
        let no_token = ClientError::NoToken { var: "V".to_owned(), file: PathBuf::from("/f") };
        assert_eq!(code_of(&anyhow::Error::new(no_token)), 4);
        let config = ConfigError::Read { path: PathBuf::from("/c"), message: "gone".to_owned() };
        assert_eq!(code_of(&anyhow::Error::new(config).context("loading")), 5);
        assert_eq!(code_of(&anyhow::Error::new(Failure::usage("no prompt"))), 2);
        assert_eq!(code_of(&anyhow::anyhow!("anything else")), 1);
    }
}
