//! Answers out over SMTP: the reply mail (in the thread, text and HTML) and
//! the [`Sink`] that lets the shared outbox pace and retry its sends.

use std::time::Duration;

use async_trait::async_trait;
use lettre::message::header::ContentType;
use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::config::{SmtpConfig, SmtpSecurity};
use crate::delivery::{Failure, Sink};

/// How long one SMTP exchange may take.
const SMTP_TIMEOUT: Duration = Duration::from_secs(60);

/// A reply to send, as kept in the delivery record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct OutgoingMail {
    /// The bare address it goes to.
    pub(super) to: String,
    pub(super) subject: String,
    /// Its own `Message-ID` (no angle brackets), fixed when the record is made,
    /// so a retry is the same mail.
    pub(super) message_id: String,
    /// The mail it answers (no angle brackets), if any.
    pub(super) in_reply_to: Option<String>,
    /// The thread's ids, oldest first (no angle brackets).
    pub(super) references: Vec<String>,
    pub(super) text: String,
}

/// Why a mail was not sent.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum SmtpError {
    /// A mail that cannot be built (a bad address): retrying will not help.
    #[error("the mail cannot be built: {0}")]
    Build(String),
    /// The server refused it for good (5xx).
    #[error("the SMTP server refused the mail: {0}")]
    Permanent(String),
    /// Connection trouble or a 4xx: worth another attempt.
    #[error("SMTP failed: {0}")]
    Transient(String),
}

/// The SMTP client: one per transport start.
#[derive(Clone)]
pub(super) struct SmtpSender {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    /// `smtp.reply_to`: the `Reply-To` of every answer.
    reply_to: Option<Mailbox>,
    /// The domain of generated Message-IDs.
    domain: String,
}

impl std::fmt::Debug for SmtpSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmtpSender").field("from", &self.from.to_string()).finish_non_exhaustive()
    }
}

impl SmtpSender {
    /// A client of `config`'s server, sending as `from`.
    ///
    /// # Errors
    /// `from` is not a mailbox, or the TLS settings cannot be built.
    pub(super) fn new(
        config: &SmtpConfig,
        password: Option<&str>,
        from: &str,
    ) -> Result<Self, String> {
        let from: Mailbox = from.parse().map_err(|e| format!("`from`: {e}"))?;
        let domain = from.email.domain().to_owned();
        let host = config.host.trim().to_owned();
        let extra_roots = match &config.tls_ca_file {
            Some(path) => {
                super::config::ca_pems(path).map_err(|e| format!("`smtp.tls_ca_file`: {e}"))?
            }
            None => Vec::new(),
        };
        let tls = || {
            let mut builder = TlsParameters::builder(host.clone());
            for pem in &extra_roots {
                let cert = lettre::transport::smtp::client::Certificate::from_pem(pem)
                    .map_err(|e| format!("`smtp.tls_ca_file`: {e}"))?;
                builder = builder.add_root_certificate(cert);
            }
            builder.build_rustls().map_err(|e| format!("`smtp.host`: TLS for {host}: {e}"))
        };
        let tls = match config.security {
            SmtpSecurity::Starttls => Tls::Required(tls()?),
            SmtpSecurity::Tls => Tls::Wrapper(tls()?),
            SmtpSecurity::None => Tls::None,
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host.clone())
            .port(config.port())
            .tls(tls)
            .timeout(Some(SMTP_TIMEOUT));
        if let (Some(username), Some(password)) = (&config.username, password) {
            builder = builder.credentials(Credentials::new(username.clone(), password.to_owned()));
        }
        if let Some(name) = config.hostname.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
            builder = builder.hello_name(ClientId::Domain(name.to_owned()));
        }
        let reply_to = match &config.reply_to {
            Some(address) => Some(address.parse().map_err(|e| format!("`smtp.reply_to`: {e}"))?),
            None => None,
        };
        Ok(SmtpSender { transport: builder.build(), from, reply_to, domain })
    }

    /// Connects, says EHLO, upgrades to TLS as configured and logs in when a
    /// password is set: whether the server would take a mail.
    ///
    /// # Errors
    /// The server's or the connection's error.
    pub(super) async fn test_connection(&self) -> Result<(), lettre::transport::smtp::Error> {
        self.transport.test_connection().await.map(|_| ())
    }

    /// A fresh `Message-ID` (no angle brackets) in the sender's domain.
    pub(super) fn new_message_id(&self, run_id: &str) -> String {
        format!("lemon.{run_id}.{}@{}", uuid_like(), self.domain)
    }

    /// The bare address replies come from.
    pub(super) fn sender_address(&self) -> String {
        self.from.email.to_string().to_ascii_lowercase()
    }

    /// Builds the mail: plain text and an HTML alternative, in the thread.
    ///
    /// # Errors
    /// [`SmtpError::Build`] for a recipient that is not an address.
    pub(super) fn build(&self, mail: &OutgoingMail) -> Result<Message, SmtpError> {
        let to: Mailbox = mail.to.parse().map_err(|e| SmtpError::Build(format!("{e}")))?;
        let mut builder = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(mail.subject.clone())
            .message_id(Some(format!("<{}>", mail.message_id)));
        if let Some(reply_to) = &self.reply_to {
            builder = builder.reply_to(reply_to.clone());
        }
        if let Some(parent) = &mail.in_reply_to {
            builder = builder.in_reply_to(format!("<{parent}>"));
        }
        if !mail.references.is_empty() {
            let refs: Vec<String> = mail.references.iter().map(|id| format!("<{id}>")).collect();
            builder = builder.references(refs.join(" "));
        }
        let body = MultiPart::alternative()
            .singlepart(
                SinglePart::builder().header(ContentType::TEXT_PLAIN).body(mail.text.clone()),
            )
            .singlepart(
                SinglePart::builder().header(ContentType::TEXT_HTML).body(to_html(&mail.text)),
            );
        let mut message = builder.multipart(body).map_err(|e| SmtpError::Build(e.to_string()))?;
        // RFC 3834: an answer by a program, so auto-responders do not answer it.
        message.headers_mut().insert_raw(lettre::message::header::HeaderValue::new(
            lettre::message::header::HeaderName::new_from_ascii_str("Auto-Submitted"),
            "auto-replied".to_owned(),
        ));
        Ok(message)
    }

    /// Sends one mail.
    ///
    /// # Errors
    /// [`SmtpError`] saying whether another attempt can help.
    pub(super) async fn send(&self, mail: &OutgoingMail) -> Result<(), SmtpError> {
        let message = self.build(mail)?;
        match self.transport.send(message).await {
            Ok(_) => Ok(()),
            Err(error) if error.is_permanent() => Err(SmtpError::Permanent(error.to_string())),
            Err(error) => Err(SmtpError::Transient(error.to_string())),
        }
    }
}

/// 16 hex digits that differ between calls.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let now = u64::try_from(lemon_core::clock::now_ms()).unwrap_or_default();
    format!("{:x}{:04x}", now, n & 0xffff)
}

/// The answer as HTML: escaped, paragraphs kept, code blocks as `<pre>`.
pub(super) fn to_html(text: &str) -> String {
    let mut html = String::from(
        "<!DOCTYPE html><html><body style=\"font-family: sans-serif; line-height: 1.4\">\n",
    );
    let mut in_code = false;
    let mut paragraph: Vec<String> = Vec::new();
    let flush = |paragraph: &mut Vec<String>, html: &mut String| {
        if !paragraph.is_empty() {
            html.push_str(&format!("<p>{}</p>\n", paragraph.join("<br>\n")));
            paragraph.clear();
        }
    };
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            if in_code {
                html.push_str("</pre>\n");
            } else {
                flush(&mut paragraph, &mut html);
                html.push_str("<pre style=\"background: #f4f4f4; padding: 8px\">");
            }
            in_code = !in_code;
            continue;
        }
        if in_code {
            html.push_str(&escape(line));
            html.push('\n');
        } else if line.trim().is_empty() {
            flush(&mut paragraph, &mut html);
        } else {
            paragraph.push(escape(line));
        }
    }
    if in_code {
        html.push_str("</pre>\n");
    }
    flush(&mut paragraph, &mut html);
    html.push_str("</body></html>\n");
    html
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The outbox's view of SMTP: a destination is a recipient; mail is never edited.
#[async_trait]
impl Sink for SmtpSender {
    type Dest = String;
    type MessageId = String;
    type Message = OutgoingMail;
    type Edit = ();
    type Receipt = String;
    type Error = SmtpError;

    fn destination(&self, message: &OutgoingMail) -> String {
        message.to.clone()
    }

    fn redirect(&self, message: &mut OutgoingMail, to: &String) {
        message.to.clone_from(to);
    }

    fn message_id(&self, receipt: &String) -> String {
        receipt.clone()
    }

    fn shown(&self, _message: OutgoingMail) -> Option<()> {
        None
    }

    fn classify(&self, error: &SmtpError) -> Failure<String> {
        match error {
            SmtpError::Transient(_) => Failure::Transient,
            SmtpError::Build(_) | SmtpError::Permanent(_) => Failure::Fatal,
        }
    }

    async fn send(&self, message: &OutgoingMail) -> Result<String, SmtpError> {
        SmtpSender::send(self, message).await?;
        Ok(message.message_id.clone())
    }

    async fn edit(&self, _dest: &String, _id: &String, _edit: &()) -> Result<(), SmtpError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
