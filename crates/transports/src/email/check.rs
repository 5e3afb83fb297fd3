//! What `doctor` asks of the mail servers: an IMAP login and an SMTP
//! connection (EHLO, STARTTLS or TLS, and AUTH when a password is set), each
//! bounded by a timeout.

use std::time::Duration;

use lemon_core::secrets::SecretStore;

use super::config::EmailConfig;

/// Why a check failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The server refused the credentials.
    Refused(String),
    /// The server could not be reached or spoke no mail protocol in time.
    Unreachable(String),
    /// A secret or setting is missing.
    Config(String),
}

/// The IMAP login of `config` (`None` without `[gateway.email.imap]`).
pub async fn imap(
    config: &EmailConfig,
    secrets: &SecretStore,
    timeout: Duration,
) -> Option<Result<String, Problem>> {
    let imap = config.imap.as_ref()?;
    let resolved = match config.resolve_secrets(secrets) {
        Ok(resolved) => resolved,
        Err(error) => return Some(Err(Problem::Config(error.to_string()))),
    };
    let Some(password) = resolved.imap_password else {
        return Some(Err(Problem::Config(format!(
            "the secret {} is not set",
            imap.password_secret
        ))));
    };
    Some(super::imap::check_login(imap, &password, timeout).await)
}

/// An SMTP connection to `config`'s server (`None` without `[gateway.email.smtp]`).
pub async fn smtp(
    config: &EmailConfig,
    secrets: &SecretStore,
    timeout: Duration,
) -> Option<Result<String, Problem>> {
    let smtp = config.smtp.as_ref()?;
    let resolved = match config.resolve_secrets(secrets) {
        Ok(resolved) => resolved,
        Err(error) => return Some(Err(Problem::Config(error.to_string()))),
    };
    let sender =
        match super::smtp::SmtpSender::new(smtp, resolved.smtp_password.as_deref(), &config.from) {
            Ok(sender) => sender,
            Err(error) => return Some(Err(Problem::Config(error))),
        };
    let addr = format!("{}:{}", smtp.host.trim(), smtp.port());
    Some(match tokio::time::timeout(timeout, sender.test_connection()).await {
        Ok(Ok(())) => Ok(match &smtp.username {
            Some(user) if resolved.smtp_password.is_some() => format!(
                "{addr} accepts EHLO and the login of {}",
                lemon_core::log_text::escape(user)
            ),
            _ => format!("{addr} accepts EHLO"),
        }),
        Ok(Err(error)) if error.is_permanent() => Err(Problem::Refused(format!("{addr}: {error}"))),
        Ok(Err(error)) => Err(Problem::Unreachable(format!("{addr}: {error}"))),
        Err(_) => Err(Problem::Unreachable(format!(
            "{addr} did not answer within {} s",
            timeout.as_secs()
        ))),
    })
}
