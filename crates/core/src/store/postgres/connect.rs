//! Connecting: the connection string (a secret: it may hold a password), TLS
//! through rustls, and the pool.
//!
//! Nothing here puts the connection string, or any part of it but the host,
//! port and database name, into an error or a log line.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::Host;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long a new connection may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a caller waits for a pooled connection before the operation fails.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// Where a store connects, for logs and errors: `host:port/database`, never the
/// user or password.
pub(crate) fn describe(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        Some(Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let database = config.get_dbname().unwrap_or("postgres");
    format!("postgres://{host}:{port}/{database}")
}

/// Reads a connection string (`postgresql://user:password@host:port/db?…` or
/// `host=… user=…`), with a connect timeout unless it sets one.
///
/// # Errors
/// What is wrong with it, without repeating it.
pub(crate) fn parse(url: &str) -> Result<Config, String> {
    let mut config = Config::from_str(url.trim()).map_err(|e| {
        // The driver's message names the bad part, not the string itself.
        format!("the connection string cannot be read: {e}")
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    config.application_name("lemon-gateway");
    Ok(config)
}

/// The TLS connector: the web's root certificates, on the ring provider the
/// gateway's other TLS uses. Used when the URL's `sslmode` is `prefer` (the
/// default: plain when the server offers no TLS) or `require`.
pub(crate) fn tls() -> MakeRustlsConnect {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    MakeRustlsConnect::new(config)
}

/// A pool of at most `size` connections to `config`'s database.
///
/// # Errors
/// When the pool cannot be built (no connection is made yet).
pub(crate) fn pool(config: Config, size: usize) -> Result<Pool, String> {
    let manager = Manager::from_config(
        config,
        tls(),
        ManagerConfig { recycling_method: RecyclingMethod::Fast },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(CONNECT_TIMEOUT + Duration::from_secs(1)))
        .build()
        .map_err(|e| format!("could not build the connection pool: {e}"))
}

/// A driver error as one line, without the connection string (the driver
/// never includes it) and with the server's own message when there is one,
/// except for a refused login, whose message names the user.
pub(crate) fn error_text(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        // Class 28, a refused login: the server's own message names the user.
        Some(db) if db.code().code() == "28P01" => {
            "the server refused the login: wrong password (28P01)".to_owned()
        }
        Some(db) if db.code().code().starts_with("28") => format!(
            "the server refused the login: this user may not connect from here ({})",
            db.code().code()
        ),
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    }
}

/// A pool error as one line.
pub(crate) fn pool_error_text(error: &deadpool_postgres::PoolError) -> String {
    match error {
        deadpool_postgres::PoolError::Backend(e) => error_text(e),
        deadpool_postgres::PoolError::Timeout(_) => {
            "no database connection became free in time".to_owned()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_string_is_described_without_its_user_or_password() {
        let config = parse("postgresql://lemon:hunter2@db.internal:6543/gateway").unwrap();
        assert_eq!(describe(&config), "postgres://db.internal:6543/gateway");
        let config = parse("host=10.0.0.5 user=lemon password=hunter2 dbname=g").unwrap();
        assert_eq!(describe(&config), "postgres://10.0.0.5:5432/g");
    }

    #[test]
    fn a_bad_connection_string_is_refused_without_repeating_it() {
        let error = parse("postgresql://lemon:hunter2@db:notaport/gateway").unwrap_err();
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.starts_with("the connection string cannot be read"), "{error}");
    }
}
